"""One decode token's GPU kernels and host syncs (freetoken/engine/launch_count.py) on the Qwen3-30B-A3B shape:
48 MoE layers, 128 experts, top-8, 32 / 4 heads. Counts depend on the structure, not the widths, so on CPU the
widths shrink (hidden 64, expert 32, head 8) and Triton runs interpreted; --full keeps the real widths (CUDA).

    python benchmarks/kernel_budget.py [--splits offload,hybrid] [--pipeline on|off] [--full] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check import FRACTION, QWEN3_30B_A3B, Shape, random_checkpoint  # noqa: E402

NARROW = Shape(QWEN3_30B_A3B.layers, QWEN3_30B_A3B.experts, QWEN3_30B_A3B.top_k, 64, 32, QWEN3_30B_A3B.heads,
               QWEN3_30B_A3B.kv_heads, 8, 256)


def count(ckpt, split_mode: str, device: str, kernels: str = "triton", pipeline: bool | None = None) -> dict:
    from freetoken.engine import CacheConfig, Engine, SamplingParams
    from freetoken.placement import Split

    split = Split("hybrid", bp=2.0, bh=1.0) if split_mode == "hybrid" else Split(split_mode)
    engine = Engine(ckpt, CacheConfig("lru", fraction=FRACTION, split=split), kernels=kernels, device=device,
                    placement="device", max_context=32, pipeline=pipeline)
    engine.count_launches = True
    list(engine.generate([1, 2, 3, 4], SamplingParams(greedy=True), max_tokens=3, stop_token_ids=[]))
    c = engine.step_count
    return {"split": split_mode, "pipeline": engine.cache.executor.pipeline, **c.to_dict(),
            "per_layer_min": min(c.per_layer), "per_layer_max": max(c.per_layer),
            "ops_per_token": dict(sorted(c.ops.items(), key=lambda kv: -kv[1]))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--splits", default="offload,hybrid")
    p.add_argument("--full", action="store_true", help="the real widths (needs CUDA and ~60 GB of host memory)")
    p.add_argument("--pipeline", choices=("on", "off"), help="the hits' and the fetched experts' FFNs apart (default: "
                   "on with CUDA, as the engine)")
    p.add_argument("--json", help="write the rows here")
    a = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.full and device != "cuda":
        print("--full needs CUDA: run without it on CPU (the counts do not depend on the widths)", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ckpt = random_checkpoint(QWEN3_30B_A3B if a.full else NARROW, dtype, device)
    pipeline = None if a.pipeline is None else a.pipeline == "on"
    rows = [count(ckpt, s, device, pipeline=pipeline) for s in a.splits.split(",")]
    for r in rows:
        print(f"Qwen3-30B-A3B shape, {r['split']:8s} pipeline {'on ' if r['pipeline'] else 'off'}: "
              f"{r['decode_kernels_per_token']} GPU kernels per token "
              f"({r['decode_kernels_per_layer']:.1f} per MoE layer, {r['per_layer_min']}..{r['per_layer_max']}; "
              f"{r['decode_triton_launches']} Triton), host syncs {r['host_syncs_per_step']} per step, "
              f"{r['host_syncs_per_token']} per token", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
