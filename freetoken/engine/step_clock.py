"""Decode time without a sync that closes the step.

generate() leaves a decode step open: the read of its sampled token is the token's one host sync. On the host the
wall clock at the step's return is its time. On CUDA the return comes before the device has run the step, so the
step records an event at its start and one at its end, and their interval (the device's time for the step, the
host's launch work before its first kernel aside) is added to the run's decode time once a later read has waited
past them: at the next step's start, or when generation ends (`fold`). A step closed by a synchronize is timed
by the wall clock on every device.
"""

from __future__ import annotations

import time

import torch


class StepClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._t0 = 0.0
        self._start: torch.cuda.Event | None = None
        self._open: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def begin(self, stats) -> None:
        self.fold(stats)
        self._t0 = time.perf_counter()
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()

    def end(self, stats, tokens: int, settled: bool) -> None:
        """The step of `tokens` tokens returned; settled: a synchronize closed it."""
        stats.decode_tokens += tokens
        if settled or not self.cuda:
            stats.decode_s += time.perf_counter() - self._t0
            return
        stop = torch.cuda.Event(enable_timing=True)
        stop.record()
        self._open.append((self._start, stop))

    def fold(self, stats) -> None:
        """Adds the open steps' device times (their events have passed once a later read waited for them)."""
        for start, stop in self._open:
            stop.synchronize()
            stats.decode_s += start.elapsed_time(stop) / 1e3
        self._open.clear()
