"""What a run of Plans moved: one record for the simulator's replay and the live engine's counters alike."""

from __future__ import annotations

from dataclasses import dataclass, fields


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
