"""A lane measured several times: median and spread, and a reading far below the rest measured again.

On a shared machine one reading can collapse (the lane measured while another process held the cores: 0.05 GB/s
where the next minute gives 7); a profile that keeps it sends `--split auto` and the hybrid split's q* the wrong
way. So each lane is read `repeats` times; a reading under LOW x the median of the others is set aside (kept in
the record) and taken again, at most `max_retries` times; the median of the kept readings is the lane's rate.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from freetoken.calibrate.measure import Rate, significant

LOW = 0.5  # a reading below half the median of the others is retried


@dataclass(frozen=True, slots=True)
class Repeated:
    readings: tuple[Rate, ...]  # the kept readings, in the order taken
    discarded: tuple[Rate, ...] = ()  # readings set aside as far below the rest

    @property
    def rates(self) -> list[float]:
        return [r.gb_s for r in self.readings]

    @property
    def median_gb_s(self) -> float:
        return statistics.median(self.rates)

    @property
    def spread(self) -> float:
        """(max - min) / median of the kept readings: 0 when they agree."""
        return (max(self.rates) - min(self.rates)) / self.median_gb_s

    def to_dict(self) -> dict:
        """`gb_s` is the median (what every reader of the profile takes); the readings stay beside it."""
        return {"gb_s": significant(self.median_gb_s), "median_gb_s": significant(self.median_gb_s),
                "min_gb_s": significant(min(self.rates)), "max_gb_s": significant(max(self.rates)),
                "spread": round(self.spread, 4), "repeats": len(self.readings), "retried": len(self.discarded),
                "discarded_gb_s": [significant(r.gb_s) for r in self.discarded],
                "peak_gb_s": significant(max(r.peak_gb_s for r in self.readings)),
                "seconds": round(sum(r.seconds for r in self.readings), 3),
                "passes": sum(r.passes for r in self.readings), "bytes_per_pass": self.readings[0].bytes_per_pass,
                "readings": [r.to_dict() for r in self.readings]}


def _worst(readings: list[dict[str, Rate]]) -> tuple[int, float]:
    """(index, ratio) of the reading furthest below the median of the others, over every lane it holds."""
    worst, ratio = -1, float("inf")
    for i, reading in enumerate(readings):
        for lane, rate in reading.items():
            others = [r[lane].gb_s for j, r in enumerate(readings) if j != i]
            if not others:
                continue
            ref = statistics.median(others)
            q = rate.gb_s / ref if ref > 0 else float("inf")
            if q < ratio:
                worst, ratio = i, q
    return worst, ratio


def measure_repeated(measure: Callable[[], dict[str, Rate]], repeats: int, low: float = LOW,
                     max_retries: int | None = None, log: Callable[[str], None] = lambda s: None
                     ) -> dict[str, Repeated]:
    """measure() -> one reading of one or more lanes taken together (lane -> Rate: a pair run at once is retried
    as a pair). max_retries: default `repeats`."""
    if repeats <= 0:
        raise ValueError(f"repeats must be positive, got {repeats}")
    if not 0 <= low < 1:
        raise ValueError(f"low must lie in [0, 1), got {low}")
    retries = repeats if max_retries is None else max_retries
    readings = [measure() for _ in range(repeats)]
    discarded: list[dict[str, Rate]] = []
    while len(discarded) < retries:
        i, ratio = _worst(readings)
        if i < 0 or ratio >= low:
            break
        log(f"reading {i + 1} at {ratio:.0%} of the others' median: measured again")
        discarded.append(readings.pop(i))
        readings.append(measure())
    return {lane: Repeated(tuple(r[lane] for r in readings), tuple(r[lane] for r in discarded))
            for lane in readings[0]}


def repeat_rate(measure: Callable[[], Rate], repeats: int, **kw) -> Repeated:
    """measure_repeated for one lane."""
    return measure_repeated(lambda: {"lane": measure()}, repeats, **kw)["lane"]
