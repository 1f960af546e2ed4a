"""What the live expert cache did: the same quantities the simulator's ReplayLog counts."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(slots=True)
class CacheCounters:
    calls: int = 0
    hits: int = 0
    fetched: int = 0
    cpu: int = 0
    evictions: int = 0
    prefetched: int = 0
    cpu_tokens: int = 0  # (token, expert) pairs the CPU lane computed
    fetched_bytes: int = 0

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
        d.update(misses=self.misses, accesses=self.accesses, hit_rate=self.hit_rate)
        return d
