"""ft warmup: compile the placement code ahead of its first use (scripts/setup.sh runs it): that use is then fast."""

from __future__ import annotations

import argparse
import sys


def register(sub) -> None:
    p = sub.add_parser("warmup", help="compile the placement policies now (cached on disk), not on first use")
    p.add_argument("--all", action="store_true", help="every built-in policy (default: lru, the quick start's), and "
                                                      "the simulator's one-pass miss-ratio curve")
    p.add_argument("--policy", action="append", default=[], metavar="NAME",
                   help="this policy (repeatable); a policy with a compiled half")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="compile in N worker processes at once (default: one per core, up to 4; 1: in this one)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import time

    from freetoken.placement import BUILTIN, POLICIES
    from freetoken.placement.compiled.cache import cache_dir
    from freetoken.placement.warmup import default_jobs, warm

    unknown = [name for name in args.policy if name not in POLICIES]
    if unknown:
        raise ValueError(f"--policy: unknown {', '.join(unknown)}; valid: {', '.join(sorted(POLICIES))}")
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs: {args.jobs} (must be at least 1)")
    names = list(BUILTIN) if args.all else args.policy or ["lru"]
    jobs = args.jobs or default_jobs()
    wall = time.perf_counter()
    spent = warm(dict.fromkeys(names), log=lambda name, s: print(f"  {name:24s} {s:6.2f} CPU s", flush=True),
                 jobs=jobs)
    if args.all:
        import numpy as np

        from freetoken.placement import KeyStream
        from freetoken.sim.mrc import lru_mrc

        t0 = time.process_time()
        lru_mrc(KeyStream(np.zeros(1, np.int64), np.array([0, 1], np.int64)))  # (numba's own cache: sim/)
        spent["the one-pass miss-ratio curve"] = time.process_time() - t0
    print(f"warm: {sum(spent.values()):.1f} CPU s in {time.perf_counter() - wall:.1f} s; cached in {cache_dir()}",
          file=sys.stderr)
    return 0
