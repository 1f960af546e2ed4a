"""Compile seconds per built-in policy: `ft sim --policy P` in a fresh process on an empty cache, then again warm.

    python benchmarks/compile_time.py [--checkout DIR] [--rounds 3] [--policies lru,belady]

A policy's compile CPU-s is its cold run's CPU time minus its warm run's (the same command, the cache then full):
what the first use costs beyond the replay itself. Each policy gets an empty cache of its own (numba's and
freetoken's, both in a temporary folder), so no policy inherits another's compiled engine room; the total of one
cache warmed policy after policy (what `ft warmup --all` pays) is reported too. --checkout runs another checkout's
code (`python -m freetoken.cli` from its folder), so two versions can be timed back to back on the same machine.
Best of --rounds for every number (CPU time is steadier than wall time on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUILTIN = ("lru", "static_layers", "frequency", "belady", "layer_sweep", "s3fifo", "lookahead", "hinted_sweep",
           "ktransformers_dynamic", "moe_infinity")


def _run(checkout: Path, cache: Path, policy: str) -> tuple[float, float]:
    """(wall s, CPU s) of one `ft sim --policy P --fraction 0.25 --json` in a child with `cache` as its caches."""
    env = {**os.environ, "FT_CACHE_DIR": str(cache), "NUMBA_CACHE_DIR": str(cache / "numba")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "freetoken.cli", "sim", "--policy", policy, "--fraction", "0.25", "--json"],
                   cwd=checkout, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(checkout: Path, policies: list[str], rounds: int, one_cache_only: bool = False) -> dict:
    best: dict = {p: {"cold_cpu": float("inf"), "warm_cpu": float("inf"), "cold_wall": float("inf"),
                      "warm_wall": float("inf"), "one_cache_cpu": float("inf")} for p in policies}
    shared_cold = float("inf")
    for _ in range(rounds):
        for p in policies if not one_cache_only else ():
            with tempfile.TemporaryDirectory(prefix="ft-compile-") as tmp:
                cold_wall, cold_cpu = _run(checkout, Path(tmp), p)
                warm_wall, warm_cpu = _run(checkout, Path(tmp), p)
            b = best[p]
            for key, v in (("cold_cpu", cold_cpu), ("warm_cpu", warm_cpu), ("cold_wall", cold_wall),
                           ("warm_wall", warm_wall)):
                b[key] = min(b[key], v)
        with tempfile.TemporaryDirectory(prefix="ft-compile-") as tmp:  # one cache, every policy in turn
            cold = {p: _run(checkout, Path(tmp), p)[1] for p in policies}
            if one_cache_only:  # each one's warm run on the same cache, once it is full
                for p in policies:
                    best[p]["warm_cpu"] = min(best[p]["warm_cpu"], _run(checkout, Path(tmp), p)[1])
        added = {p: cold[p] - best[p]["warm_cpu"] for p in policies}
        for p, cpu in added.items():
            best[p]["one_cache_cpu"] = min(best[p]["one_cache_cpu"], cpu)
        shared_cold = min(shared_cold, sum(added.values()))
    for b in best.values():
        b["compile_cpu"] = b["cold_cpu"] - b["warm_cpu"]
    return {"policies": best, "total_compile_cpu": sum(b["compile_cpu"] for b in best.values()),
            "one_cache_compile_cpu": shared_cold}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkout", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--policies", default=",".join(BUILTIN))
    ap.add_argument("--one-cache-only", action="store_true",
                    help="only every policy in turn on one cache (each policy's share, what `ft warmup --all` pays)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = measure(Path(args.checkout), [p for p in args.policies.split(",") if p], args.rounds, args.one_cache_only)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{args.checkout}: best of {args.rounds}; CPU s (wall s)")
    for p, b in out["policies"].items():
        print(f"  {p:22s} compile {b['compile_cpu']:6.2f}   cold {b['cold_cpu']:6.2f} ({b['cold_wall']:6.2f})   "
              f"warm {b['warm_cpu']:5.2f} ({b['warm_wall']:5.2f})   its share on one cache {b['one_cache_cpu']:6.2f}")
    if not args.one_cache_only:
        print(f"  every policy, each on an empty cache: {out['total_compile_cpu']:.1f} CPU s of compiling")
    print(f"  every policy in turn on one cache:    {out['one_cache_compile_cpu']:.1f} CPU s of compiling")
    return 0


if __name__ == "__main__":
    sys.exit(main())
