"""Where a decode step's time goes: torch.profiler over N decode tokens of the random Qwen3-30B-A3B-shaped model
(random_model.py) at each cache fraction: wall ms per token, GPU kernel ms per token (the GPU's busy share), and the
kernels that take the most GPU time. Wall time far above kernel time means the host (Python, launches, waits) is the
limit.

    python benchmarks/decode_profile.py --fractions 1.0,0.37           # one CUDA GPU
    python benchmarks/decode_profile.py --dry-run                      # anywhere: tiny shape, CPU, interpreter
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent))


def profile_fraction(ckpt, fraction: float, split: str, tokens: int, device: str, kernels: str, top: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from freetoken.engine import CacheConfig, Engine, SamplingParams
    from freetoken.placement import Split

    engine = Engine(ckpt, CacheConfig("lru", fraction=fraction, split=Split(split)), kernels=kernels, device=device,
                    max_context=64 + tokens)
    prompt = torch.randint(0, ckpt.config.vocab_size, (16,), generator=torch.Generator().manual_seed(1)).tolist()
    list(engine.generate(prompt, SamplingParams(greedy=True), max_tokens=4, stop_token_ids=[]))  # compile, capture
    kv = engine.new_kv(64 + tokens)
    token = int(engine.prefill(prompt, kv)[-1].argmax())
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    sync()
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(tokens):
            token = int(engine.decode(token, kv)[-1].argmax())  # the sampled id's read-back, as generate has
        sync()
        wall = time.perf_counter() - t0
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = per_kernel[e.name]
            k[0] += e.time_range.elapsed_us()
            k[1] += 1
    gpu_us = sum(v[0] for v in per_kernel.values())
    rows = sorted(per_kernel.items(), key=lambda kv_: -kv_[1][0])[:top]
    out = {"fraction": fraction, "capacity": engine.cache.capacity, "wall_ms_per_token": 1e3 * wall / tokens,
           "gpu_ms_per_token": gpu_us / 1e3 / tokens,
           "kernels_per_token": sum(v[1] for v in per_kernel.values()) / tokens,
           "decode_mode": engine.decode_line,
           "top": [{"kernel": name[:90], "ms_per_token": us / 1e3 / tokens, "calls_per_token": n / tokens}
                   for name, (us, n) in rows]}
    print(f"fraction {fraction} ({out['capacity']} slots, {split}): wall {out['wall_ms_per_token']:.2f} ms/token, "
          f"GPU kernels {out['gpu_ms_per_token']:.2f} ms/token ({out['kernels_per_token']:.0f} kernels); "
          f"{engine.decode_line}", flush=True)
    for r in out["top"]:
        print(f"  {r['ms_per_token']:8.3f} ms  {r['calls_per_token']:6.1f}x  {r['kernel']}")
    return out


def main(argv: list[str] | None = None) -> int:
    import random_model as models

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fractions", default="1.0,0.37", help="cache fractions, comma-separated")
    p.add_argument("--split", default="offload", choices=["offload", "hybrid", "cpu"])
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--json", metavar="PATH")
    a = p.parse_args(argv)
    try:
        fractions = [float(f) for f in a.fractions.split(",")]
    except ValueError:
        print(f"error: --fractions {a.fractions!r}: expected numbers like 1.0,0.37", file=sys.stderr)
        return 2
    if not a.dry_run and not torch.cuda.is_available():
        print("error: no CUDA device here: run with --dry-run on a CPU machine", file=sys.stderr)
        return 2
    device = "cpu" if a.dry_run else "cuda"
    shape, dtype = (models.TINY, torch.float32) if a.dry_run else (models.QWEN3_30B_A3B, torch.bfloat16)
    ckpt = models.random_checkpoint(shape, dtype, device)
    kernels = "reference" if a.dry_run else "triton"
    results = []
    for f in fractions:
        results.append(profile_fraction(ckpt, f, a.split, a.tokens, device, kernels, a.top))
        models.free_device_memory()
    if a.json:
        import json

        from freetoken.io import write_atomic

        write_atomic(Path(a.json), json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
