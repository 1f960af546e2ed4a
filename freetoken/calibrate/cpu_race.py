"""Interleaved best-of-N timing of several engines in one process.

Run one side after the other and a load spike (another process on a shared machine) lands on one side only and
flips the verdict. Here every round runs each contender once, in an order rotated round by round (none always
follows the same neighbour), after untimed warm-up rounds; each contender keeps its fastest prefill and its fastest
decode over the rounds: a spike slows some runs of every side rather than all runs of one.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Sample:
    """One greedy generation: seconds of the prompt's prefill, seconds of the decode steps, and the tokens chosen
    (the one after the prompt, then one per decode step)."""

    prefill_s: float
    decode_s: float
    tokens: tuple[int, ...]


class Contender(Protocol):
    name: str

    def run(self) -> Sample: ...


def time_generation(prefill: Callable[[], int], step: Callable[[int], int], decode_tokens: int,
                    clock: Clock = time.perf_counter) -> Sample:
    """prefill() -> the first greedy token; step(token) -> the next one, `decode_tokens` times."""
    t0 = clock()
    tokens = [int(prefill())]
    t1 = clock()
    for _ in range(decode_tokens):
        tokens.append(int(step(tokens[-1])))
    return Sample(t1 - t0, clock() - t1, tuple(tokens))


@dataclass(slots=True)
class Tally:
    name: str
    samples: list[Sample] = field(default_factory=list)

    @property
    def best_prefill_s(self) -> float:
        return min(s.prefill_s for s in self.samples)

    @property
    def best_decode_s(self) -> float:
        return min(s.decode_s for s in self.samples)

    @property
    def median_prefill_s(self) -> float:
        return statistics.median(s.prefill_s for s in self.samples)

    @property
    def median_decode_s(self) -> float:
        return statistics.median(s.decode_s for s in self.samples)

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.samples[0].tokens

    @property
    def stable(self) -> bool:
        """Every run chose the same tokens (a deterministic engine must)."""
        return all(s.tokens == self.tokens for s in self.samples)


@dataclass(slots=True)
class RaceResult:
    tallies: dict[str, Tally]
    probes: dict[str, list[float]]  # each probe's reading, one per timed round
    order: list[str]  # the names in the order they ran, warm-up included

    def best_probe(self, name: str) -> float:
        return max(self.probes[name])


def rotation(n: int, round_index: int) -> list[int]:
    """Round r runs contender (r + i) mod n as its i-th."""
    return [(round_index + i) % n for i in range(n)]


def race(contenders: Sequence[Contender], reps: int, warmup: int = 1,
         probes: dict[str, Callable[[], float]] | None = None, tick: Callable[[], None] = lambda: None) -> RaceResult:
    """`warmup` untimed rounds, then `reps` timed ones; each probe (e.g. a memory-bandwidth reading) runs once at the
    start of every timed round, interleaved with the contenders too. tick() after every run (a progress bar)."""
    if reps <= 0 or warmup < 0:
        raise ValueError(f"reps must be positive and warmup non-negative, got {reps}, {warmup}")
    names = [c.name for c in contenders]
    if len(set(names)) != len(names):
        raise ValueError(f"contender names must differ, got {names}")
    probes = probes or {}
    tallies = {c.name: Tally(c.name) for c in contenders}
    readings: dict[str, list[float]] = {name: [] for name in probes}
    order: list[str] = []
    for r in range(warmup + reps):
        timed = r >= warmup
        if timed:
            for name, probe in probes.items():
                readings[name].append(float(probe()))
        for i in rotation(len(contenders), r):
            c = contenders[i]
            sample = c.run()
            order.append(c.name)
            if timed:
                tallies[c.name].samples.append(sample)
            tick()
    return RaceResult(tallies, readings, order)


def matching_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two greedy runs share (random-weight logits are near ties: a rounding difference
    may flip one token, and everything after it differs)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
