"""Prefill with glibc's default allocator settings and with freed memory kept for reuse (freetoken/host/malloc.py),
for ft and for HF transformers: each (side, setting) in fresh child processes, alternating, best of N, with each
child's peak RSS.

    python benchmarks/host_malloc.py [--model CKPT] [--prompt-tokens 2048] [--children 3] [--threads 1]

Default model: `ft bench cpu --against hf`'s random qwen3_5_moe (built once and cached).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time, torch
side, model, P, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
from freetoken.host.malloc import keep_freed_memory
keep_freed_memory()  # FT_HOST_MALLOC decides (the engine calls it too)
torch.set_num_threads(threads)
ids = torch.randint(1, 300, (P,), generator=torch.Generator().manual_seed(0))
if side == "ft":
    from freetoken.engine import CacheConfig, Engine
    eng = Engine.from_pretrained(model, CacheConfig("lru", fraction=1.0), kernels="host", device="cpu",
                                 record=False, threads=threads)
    def run():
        eng.prefill(ids.tolist(), eng.new_kv(P + 8))
else:
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).eval()
    def run():
        with torch.no_grad():
            hf(ids[None])
run()
best = float("inf")
for _ in range(3):
    t = time.perf_counter(); run(); best = min(best, time.perf_counter() - t)
peak = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")][0] * 1024
print("RESULT", json.dumps({"seconds": best, "peak_rss": peak}))
"""


def child(side: str, setting: str, model: Path, tokens: int, threads: int) -> dict:
    env = dict(os.environ, FT_HOST_MALLOC=setting, TRANSFORMERS_VERBOSITY="error")
    out = subprocess.run([sys.executable, "-c", CHILD, side, str(model), str(tokens), str(threads)], env=env,
                         capture_output=True, text=True)
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if out.returncode or not lines:
        raise SystemExit(f"{side} child (FT_HOST_MALLOC={setting}) failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(lines[-1][7:])


def main() -> None:
    from freetoken.calibrate.checkpoints import RandomMoE, random_checkpoint
    from freetoken.calibrate.cpu_bench import default_work_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path)
    p.add_argument("--prompt-tokens", type=int, default=2048)
    p.add_argument("--children", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sides", default="ft,hf")
    args = p.parse_args()
    model = args.model or random_checkpoint(RandomMoE.hf_default("qwen3_5_moe"), Path(default_work_dir()))
    sides = [s for s in args.sides.split(",") if s]
    best: dict = {}
    for _ in range(args.children):
        for side in sides:
            for setting in ("0", "1"):
                r = child(side, setting, model, args.prompt_tokens, args.threads)
                b = best.setdefault((side, setting), {"seconds": float("inf"), "peak_rss": 0})
                b["seconds"] = min(b["seconds"], r["seconds"])
                b["peak_rss"] = max(b["peak_rss"], r["peak_rss"])
    print(f"{args.prompt_tokens}-token prefill on {model}, {args.threads} thread(s), best of {args.children} children x 3")
    for side in sides:
        off, on = best[(side, "0")], best[(side, "1")]
        print(f"  {side}: glibc defaults {off['seconds'] * 1e3:.0f} ms (peak RSS {off['peak_rss'] / 1e9:.2f} GB), "
              f"freed memory kept {on['seconds'] * 1e3:.0f} ms (peak RSS {on['peak_rss'] / 1e9:.2f} GB): "
              f"{off['seconds'] / on['seconds']:.2f}x")


if __name__ == "__main__":
    main()
