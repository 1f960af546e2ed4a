"""Compiled sweep-family replay speed (layer_sweep, lookahead, hinted_sweep), this checkout against another one.

    python benchmarks/sweep_speed.py --against /path/to/other/checkout [--rounds 3]

Each round runs one worker process per checkout (alternating which goes first), each replaying every case once
after an untimed warm-up (a few calls: it loads the compiled driver); a case's time is the best CPU time over the
rounds (and over 5 replays per round on Mixtral, whose replays take milliseconds). Cases: Mixtral token level (each token its own call) and DeepSeek-V2-Lite (prefill chunks of 2048) at
10/25/50% of all experts, with the policies' default options plus hinted_sweep at depth 31. Each case's log
(hits, fetches, evictions, prefetches per call) is hashed: the two checkouts must decide identically.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CASES = [("layer_sweep", {}), ("lookahead", {}), ("hinted_sweep", {}), ("hinted_sweep", {"depth": 31})]
FRACTIONS = (0.10, 0.25, 0.50)
REPEAT = {"mixtral": 5, "deepseek": 1}  # replays per case and worker (Mixtral's take a few ms)


def _traces():
    import numpy as np

    from freetoken.placement import DECODE
    from freetoken.trace import RoutingTrace
    from freetoken.trace.importers import import_trace
    from sim.calls import trace_stream

    root = Path(os.environ.get("FT_SHARED_TRACES", Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"))
    mix = import_trace(root / "mixtral-8x7b" / "humaneval_2_routing.jsonl")
    mix = RoutingTrace(mix.experts, mix.num_experts, request=mix.request,
                       phase=np.full(mix.num_tokens, DECODE, np.int8))
    ds = import_trace(root / "deepseek-v2-lite" / "deepseek_v2_lite_prefill_top6.npz")
    return {"mixtral": (mix, trace_stream(mix, 1)), "deepseek": (ds, trace_stream(ds, 2048))}


def worker() -> None:
    """One pass over every case in this checkout; prints one JSON line per case."""
    import numpy as np

    from freetoken.placement import Split, make_policy
    from sim.replay import replay_stream

    split = Split("offload")
    for trace_name, (trace, stream) in _traces().items():
        L, E = trace.num_layers, trace.num_experts
        for name, options in CASES:
            for fraction in FRACTIONS:
                cap = max(int(stream.sizes().max()), round(fraction * trace.num_keys))

                def build():
                    extra = {"future": stream.key_stream()} if name != "layer_sweep" else {}
                    return make_policy(name, cap, L, E, **extra, **options)

                replay_stream(stream, build(), split)  # loads the compiled code, untimed
                cpu = float("inf")
                for _ in range(REPEAT[trace_name]):  # a fresh policy each time; the best CPU time counts
                    policy = build()
                    c0 = time.process_time()
                    log = replay_stream(stream, policy, split).log
                    cpu = min(cpu, time.process_time() - c0)
                # per call: hits, fetched, cpu, evictions, prefetched (the replay API both checkouts share)
                moved = np.stack([log.hits, log.fetched, log.cpu, log.evictions, log.prefetched]).astype(np.int64)
                digest = hashlib.sha256(np.ascontiguousarray(moved).tobytes()).hexdigest()[:16]
                print(json.dumps({"case": f"{trace_name} {name}{options or ''} {fraction:.0%}",
                                  "accesses": int(stream.num_accesses), "cpu_s": cpu, "digest": digest,
                                  "misses": int(log.fetched.sum() + log.cpu.sum())}), flush=True)


def _run(checkout: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker"], env=env, cwd=checkout,
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"worker in {checkout} failed:\n{done.stderr[-2000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", type=Path, help="the other checkout (the baseline)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker()
        return 0
    if args.against is None or not (args.against / "freetoken").is_dir():
        print("--against: a checkout of this repository is needed", file=sys.stderr)
        return 2
    sides = {"old": args.against.resolve(), "new": Path(__file__).resolve().parents[1]}
    best: dict[str, dict[str, dict]] = {"old": {}, "new": {}}
    for r in range(args.rounds):
        for side in (["old", "new"] if r % 2 == 0 else ["new", "old"]):
            for row in _run(sides[side]):
                prev = best[side].get(row["case"])
                if prev is None or row["cpu_s"] < prev["cpu_s"]:
                    best[side][row["case"]] = row
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"{'case':44s} {'old acc/s':>12s} {'new acc/s':>12s} {'new/old':>8s}  same")
    for case, old in best["old"].items():
        new = best["new"][case]
        a_old, a_new = old["accesses"] / old["cpu_s"], new["accesses"] / new["cpu_s"]
        print(f"{case:44s} {a_old:12,.0f} {a_new:12,.0f} {a_new / a_old:8.2f}  {old['digest'] == new['digest']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
