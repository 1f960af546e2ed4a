"""CPU-lane threads = physical cores: SMT siblings share one core's FMA units and memory port, so a bandwidth-bound
expert GEMV gains nothing from them and loses to the contention."""

from __future__ import annotations

import os
from pathlib import Path


def physical_cores(cpuinfo: str | None = None) -> int:
    """Distinct (physical id, core id) pairs of /proc/cpuinfo (or the text given); os.cpu_count() where it has none."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.is_file() else ""
    cores, package = set(), "0"
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name == "physical id":
            package = value.strip()
        elif name == "core id":
            cores.add((package, value.strip()))
    return len(cores) or os.cpu_count() or 1
