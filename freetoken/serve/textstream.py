"""Token ids in, text deltas out: incremental detokenizing that never emits half a character, a stop string, or
text after a hold marker (a tool-call opening tag, parsed once the output is complete)."""

from __future__ import annotations

from typing import Callable, Sequence

Decode = Callable[[Sequence[int]], str]


class TextStream:
    def __init__(self, decode: Decode, stops: Sequence[str] = (), hold_markers: Sequence[str] = ()):
        self.decode = decode
        self.stops = [s for s in stops if s]
        self.markers = [m for m in hold_markers if m]
        self.ids: list[int] = []
        self.text = ""  # everything decoded so far (up to a stop string, which is cut off)
        self.stop: str | None = None  # the stop string that ended the text, if any
        self._sent = 0  # chars of text already emitted
        self._prefix_offset = 0  # token window for incremental decoding (TGI-style)
        self._read_offset = 0

    def push(self, token_id: int) -> str:
        """Adds one token; returns the text that is now safe to emit (maybe empty). After a stop string, ''."""
        if self.stop is not None:
            return ""
        self.ids.append(token_id)
        if not self._decode_window(final=False):
            return ""  # a multi-byte character is not complete yet
        return self._release(final=self.stop is not None)

    def finish(self) -> str:
        """The rest, once no more tokens come (bytes of an unfinished character decode as U+FFFD, as a whole-text
        decode has them)."""
        if self.stop is None:
            self._decode_window(final=True)
        return self._release(final=True)

    def _decode_window(self, final: bool) -> bool:
        """Appends the text of the tokens since the last clean boundary; False while it ends mid-character.

        The window restarts only after text that ends in a whole character, so window texts concatenate to the
        decode of all ids (TGI's prefix/read offsets)."""
        before = self.decode(self.ids[self._prefix_offset:self._read_offset])
        after = self.decode(self.ids[self._prefix_offset:])
        if not final and (len(after) <= len(before) or after.endswith("\ufffd")):
            return False
        self.text += after[len(before):]
        self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
        hits = [(i, s) for s in self.stops if (i := self.text.find(s, max(0, self._sent - len(s)))) >= 0]
        if hits:
            idx, self.stop = min(hits)
            self.text = self.text[:idx]
        return True

    @property
    def held(self) -> str:
        """Text from the first hold marker on: never emitted as text."""
        idx = self._marker_at()
        return "" if idx is None else self.text[idx:]

    def _marker_at(self) -> int | None:
        found = [i for i in (self.text.find(m) for m in self.markers) if i >= 0]
        return min(found) if found else None

    def _release(self, final: bool) -> str:
        end = len(self.text)
        marker = self._marker_at()
        if marker is not None:
            end = marker
        elif not final:
            end -= _partial_suffix(self.text, self.stops + self.markers)
        delta = self.text[self._sent:end] if end > self._sent else ""
        self._sent = max(self._sent, end)
        return delta


def _partial_suffix(text: str, needles: Sequence[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a needle (could still become one)."""
    best = 0
    for n in needles:
        for k in range(min(len(n) - 1, len(text)), best, -1):
            if text.endswith(n[:k]):
                best = k
                break
    return best
