"""Token ids in, text deltas out: incremental detokenizing that never emits half a character, a stop string, or
text after a hold marker (a tool-call opening tag, parsed once the output is complete)."""

from __future__ import annotations

from typing import Callable, Sequence

from freetoken.serve.stopmatch import StopAutomaton, StopMatcher

Decode = Callable[[Sequence[int]], str]


class TextStream:
    """stops: cut the text before the first one (include_stop: after it); markers: hold the text from the first
    one on. Both are found by one StopMatcher over the new characters of each token; stops are armed from char
    offset `armed_at` on (min_tokens: none count before the request's first min_tokens tokens)."""

    def __init__(self, decode: Decode, stops: Sequence[str] = (), hold_markers: Sequence[str] = (),
                 include_stop: bool = False, armed: bool = True):
        """stops and hold_markers: strings, or stops alone as a StopAutomaton built for them (no markers)."""
        self.decode = decode
        if isinstance(stops, StopAutomaton):
            self.stops, self.markers, self.matcher = list(stops.needles), [], StopMatcher(stops)
        else:
            self.stops = [s for s in stops if s]
            self.markers = [m for m in hold_markers if m]
            self.matcher = StopMatcher(self.stops + self.markers)
        self.include_stop = include_stop
        self.armed_at: int | None = 0 if armed else None  # chars before which no stop counts; None: not yet
        self.ids: list[int] = []
        self.text = ""  # everything decoded so far (up to a stop string, which is cut off)
        self.stop: str | None = None  # the stop string that ended the text, if any
        self.marker_at: int | None = None  # where the first hold marker begins
        self._sent = 0  # chars of text already emitted
        self._prefix_offset = 0  # token window for incremental decoding (TGI-style)
        self._read_offset = 0

    def arm(self) -> None:
        """Stop strings count from here on (min_tokens reached)."""
        if self.armed_at is None:
            self.armed_at = len(self.text)

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
        new = after[len(before):]
        self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
        self._scan(new)
        return True

    def _scan(self, new: str) -> None:
        """Appends new text, character by character through the matcher, up to a stop string."""
        nstops, base = len(self.stops), len(self.text)
        self.text += new
        for i, ch in enumerate(new):
            hit = self.matcher.feed(ch)
            if hit is None:
                continue
            if hit.needle >= nstops:
                if self.marker_at is None:
                    self.marker_at = hit.start
            elif self.armed_at is not None and hit.start >= self.armed_at:
                self.stop = self.stops[hit.needle]
                self.text = self.text[:base + i + 1] if self.include_stop else self.text[:hit.start]
                return

    @property
    def held(self) -> str:
        """Text from the first hold marker on: never emitted as text."""
        return "" if self.marker_at is None else self.text[self.marker_at:]

    def _release(self, final: bool) -> str:
        end = len(self.text)
        if self.marker_at is not None:
            end = min(end, self.marker_at)
        elif not final:
            end -= min(self.matcher.partial, end)
        delta = self.text[self._sent:end] if end > self._sent else ""
        self._sent = max(self._sent, end)
        return delta


def _partial_suffix(text: str, needles: Sequence[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a needle (could still become one); for the
    few short markers the output parsers hold back (`</think>`, a tool-call tag)."""
    best = 0
    for n in needles:
        for k in range(min(len(n) - 1, len(text)), best, -1):
            if text.endswith(n[:k]):
                best = k
                break
    return best
