"""What a run of Plans moved: one record for the simulator's replay and the live engine's counters alike, and how it
is summed from per-call columns (sim.replay.ReplayLog, the engine executor's call log): over a mask, or per group."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


@dataclass(slots=True)
class Counts:
    calls: int = 0
    hits: int = 0
    fetched: int = 0
    cpu: int = 0
    evictions: int = 0
    prefetched: int = 0
    cpu_tokens: int = 0  # (token, expert) pairs the CPU lane computed
    fetched_bytes: int = 0  # fetched + prefetched experts, in bytes

    def copy(self) -> Counts:
        """A fresh record of the same counts (a fifth of dataclasses.replace's time: a small replay reads it)."""
        return Counts(self.calls, self.hits, self.fetched, self.cpu, self.evictions, self.prefetched, self.cpu_tokens,
                      self.fetched_bytes)

    @property
    def misses(self) -> int:
        return self.fetched + self.cpu

    @property
    def accesses(self) -> int:
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(misses=self.misses, accesses=self.accesses, hit_rate=self.hit_rate,
                 miss_rate=1.0 - self.hit_rate if self.accesses else 0.0)
        return d


COUNTED = ("hits", "fetched", "cpu", "evictions", "prefetched", "cpu_tokens")  # Counts' per-call columns


def count_by(log, group: np.ndarray, expert_bytes: int = 0) -> dict[int, Counts]:
    """count() per distinct value of group ([calls], e.g. the log's request column), in one pass over each column
    (a masked count per value is a pass per value: seconds for a trace of thousands of requests)."""
    ids, inverse, calls = np.unique(group, return_inverse=True, return_counts=True)
    sums = [np.bincount(inverse, np.asarray(getattr(log, c)), len(ids)).astype(np.int64).tolist() for c in COUNTED]
    return {int(g): Counts(int(n), h, f, c, ev, pf, ct, (f + pf) * expert_bytes)
            for g, n, h, f, c, ev, pf, ct in zip(ids.tolist(), calls.tolist(), *sums)}


def count(log, mask: np.ndarray | None = None, expert_bytes: int = 0) -> Counts:
    """Sum per-call columns (hits, fetched, cpu, evictions, prefetched, cpu_tokens: [calls] arrays on `log`) over
    the calls where mask is true (all when None)."""
    columns = (np.asarray(getattr(log, c)) for c in COUNTED)
    hits, fetched, cpu, evictions, prefetched, cpu_tokens = (
        int(np.add.reduce(c if mask is None else c[mask])) for c in columns)
    return Counts(
        calls=int(np.count_nonzero(mask)) if mask is not None else len(log.hits),
        hits=hits,
        fetched=fetched,
        cpu=cpu,
        evictions=evictions,
        prefetched=prefetched,
        cpu_tokens=cpu_tokens,
        fetched_bytes=(fetched + prefetched) * expert_bytes,
    )
