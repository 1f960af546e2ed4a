"""Stop strings and hold markers found in streamed text in O(new characters) per token: one Aho-Corasick automaton
over all of them, built once per request off the event loop (and shared by its sequences; the same list of stops
is built once for all requests, up to a few lists), each sequence keeping only its state. The state after each
character is the longest suffix of the text that is a prefix of some needle, which is also how much text must be
held back in case a needle is still completing."""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass
from typing import Sequence

MAX_STOPS = 64  # stop strings per request (OpenAI takes 4; more are refused with a 400 naming the cap)
MAX_STOP_CHARS = 1024  # characters per stop string


@dataclass(frozen=True, slots=True)
class Match:
    start: int  # offset of the needle's first character in the text fed so far
    needle: int  # its index in the needles given


class StopAutomaton:
    """The immutable part: goto / fail links, each state's depth and the longest needle ending there."""

    def __init__(self, needles: Sequence[str]):
        self.needles = list(needles)
        self.goto: list[dict[str, int]] = [{}]
        self.fail: list[int] = [0]
        self.depth: list[int] = [0]
        self.out: list[int] = [-1]  # the longest needle ending at this state (after fail links), -1: none
        for i, needle in enumerate(self.needles):
            self._add(needle, i)
        self._link()

    def _add(self, needle: str, index: int) -> None:
        state = 0
        for ch in needle:
            nxt = self.goto[state].get(ch)
            if nxt is None:
                nxt = len(self.goto)
                self.goto[state][ch] = nxt
                self.goto.append({})
                self.fail.append(0)
                self.depth.append(self.depth[state] + 1)
                self.out.append(-1)
            state = nxt
        if needle and self.out[state] < 0:
            self.out[state] = index

    def _link(self) -> None:
        queue = deque(self.goto[0].values())
        while queue:
            state = queue.popleft()
            for ch, nxt in self.goto[state].items():
                f = self.fail[state]
                while f and ch not in self.goto[f]:
                    f = self.fail[f]
                self.fail[nxt] = self.goto[f].get(ch, 0) if self.goto[f].get(ch, 0) != nxt else 0
                if self.out[nxt] < 0:  # a shorter needle that ends here through the fail link
                    self.out[nxt] = self.out[self.fail[nxt]]
                queue.append(nxt)


@functools.lru_cache(maxsize=8)
def automaton(needles: tuple[str, ...]) -> StopAutomaton:
    return StopAutomaton(needles)


class StopMatcher:
    """One text's position in an automaton."""

    def __init__(self, needles: Sequence[str] | StopAutomaton):
        self.a = needles if isinstance(needles, StopAutomaton) else automaton(tuple(needles))
        self.needles = self.a.needles
        self.state = 0
        self.fed = 0  # characters fed

    def feed(self, text: str) -> Match | None:
        """Advances over text; the match that starts first among those completing in it, if any."""
        a, best = self.a, None
        for ch in text:
            state = self.state
            while state and ch not in a.goto[state]:
                state = a.fail[state]
            self.state = a.goto[state].get(ch, 0)
            self.fed += 1
            needle = a.out[self.state]  # the longest needle ending here: the one that starts first
            if needle >= 0:
                hit = Match(self.fed - len(a.needles[needle]), needle)
                if best is None or hit.start < best.start:
                    best = hit
        return best

    @property
    def partial(self) -> int:
        """Characters at the end of the text that may still become a needle."""
        return self.a.depth[self.state]


def check_stops(stops: Sequence[str], param: str = "stop") -> None:
    """The caps on stop strings, a ValueError naming the field (the caller's 400)."""
    if len(stops) > MAX_STOPS:
        raise ValueError(f"{param}: at most {MAX_STOPS} stop strings, got {len(stops)}")
    for i, s in enumerate(stops):
        if len(s) > MAX_STOP_CHARS:
            raise ValueError(f"{param}[{i}]: a stop string is at most {MAX_STOP_CHARS} characters, got {len(s)}")
