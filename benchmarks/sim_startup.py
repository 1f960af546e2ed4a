"""Warm `ft sim` on the quick-start trace: wall and CPU seconds of the whole process, and how much of it is imports.

    python benchmarks/sim_startup.py [--runs 7] [--checkout DIR]

Each run is a fresh `python -X importtime -m freetoken.cli sim --policy lru --fraction 0.25` on a warm cache (one
untimed run first); imports are the top-level entries of -X importtime summed (every import the run makes, lazy ones
included; -X importtime's own overhead is in them). `import numba` alone is timed too: the floor any run that
replays in compiled code pays. Best of --runs for each number (the machine's other load only adds time).
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

SIM = ["-m", "freetoken.cli", "sim", "--policy", "lru", "--fraction", "0.25"]


def _timed(checkout: Path, args: list[str]) -> tuple[float, float, str]:
    """(wall s, CPU s, stderr) of one child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, *args], cwd=checkout, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, out.stderr


def imports_seconds(importtime: str) -> float:
    """Sum of -X importtime's top-level cumulative times (a name not indented)."""
    total = 0
    for line in importtime.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)\S", line)
        if m and not m.group(2):
            total += int(m.group(1))
    return total / 1e6


def measure(checkout: Path, runs: int) -> dict:
    _timed(checkout, SIM)  # warm the cache (and the OS's file cache)
    best = {"wall_s": float("inf"), "cpu_s": float("inf"), "imports_s": float("inf"), "plain_wall_s": float("inf"),
            "numba_import_s": float("inf")}
    for _ in range(runs):
        wall, cpu, _ = _timed(checkout, SIM)
        _, _, importtime = _timed(checkout, ["-X", "importtime", *SIM])
        numba_wall, _, _ = _timed(checkout, ["-c", "import numba"])
        python_wall, _, _ = _timed(checkout, ["-c", "pass"])
        best["wall_s"], best["cpu_s"] = min(best["wall_s"], wall), min(best["cpu_s"], cpu)
        best["imports_s"] = min(best["imports_s"], imports_seconds(importtime))
        best["numba_import_s"] = min(best["numba_import_s"], numba_wall - python_wall)
        best["plain_wall_s"] = min(best["plain_wall_s"], python_wall)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkout", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = measure(Path(args.checkout), args.runs)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{args.checkout}: warm `ft sim --policy lru --fraction 0.25`, best of {args.runs}: {out['wall_s']:.2f} s "
          f"wall, {out['cpu_s']:.2f} s CPU; imports {out['imports_s']:.2f} s (-X importtime), of which "
          f"`import numba` alone {out['numba_import_s']:.2f} s; an empty interpreter {out['plain_wall_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
