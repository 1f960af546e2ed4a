"""Fill freetoken/kernels/tuned_configs.json for this GPU: time candidate launch configs of the decode kernels at
real model shapes (L2 flushed, CUDA graphs: kernel_timing.py), keep the fastest correct one per shape class.

    python benchmarks/tune_kernels.py                 # on a CUDA machine: writes this device's entry
    python benchmarks/tune_kernels.py --quick         # a smaller grid (minutes)
    python benchmarks/tune_kernels.py --dry-run --out /tmp/t.json   # anywhere: tiny shapes, interpreter, 2 candidates

A shape class is scored by the sum of its shapes' times (batch 1: k, router for narrow linears; fused qkv, o for
wide ones; Qwen3-30B-A3B, Mixtral-8x7B and DeepSeek-V3 expert shapes for the expert FFN). Candidates whose output
differs from the torch reference are dropped. Other devices' entries in the file are kept.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

# (D_out, D_in) per linear shape class; (D, I, K picks) per expert FFN shape
LINEAR_SHAPES = {"narrow": [(512, 2048), (128, 2048), (256, 7168)], "wide": [(5120, 2048), (2048, 4096), (6144, 4096)]}
FFN_SHAPES = [(2048, 768, 8), (4096, 14336, 2), (7168, 2048, 8)]
TINY_LINEAR = {"narrow": [(12, 70)], "wide": [(2100, 20)]}
TINY_FFN = [(24, 40, 2)]


def linear_grid(quick: bool) -> list[dict]:
    keys = ("BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "ctas_per_sm", "min_k_per_split")
    values = ([8, 16], [256], [4], [2, 3], [2, 4], [256]) if quick else \
        ([4, 8, 16, 32], [128, 256, 512], [4, 8], [2, 3], [1, 2, 4, 8], [256, 512])
    return [dict(zip(keys, v)) for v in itertools.product(*values)]


def ffn_grid(quick: bool) -> list[dict]:
    keys = ("GATE_UP_BLOCK_N", "DOWN_BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "ctas_per_sm", "min_k_per_split")
    values = ([32], [32, 64], [64], [4], [3], [1, 2, 4], [256]) if quick else \
        ([16, 32, 64], [32, 64, 128], [32, 64, 128], [4, 8], [2, 3, 4], [1, 2, 4], [256, 512])
    return [dict(zip(keys, v)) for v in itertools.product(*values)]


def dry_grid(full: list[dict]) -> list[dict]:
    """Two candidates with blocks small enough for tiny shapes."""
    small = [dict(c, **{k: 16 for k in c if k.startswith(("BLOCK", "GATE", "DOWN"))}) for c in full[:2]]
    return [dict(small[0], ctas_per_sm=1), dict(small[-1], ctas_per_sm=8, min_k_per_split=16)]


def _score(kernel: str, shape_class: str, config: dict, calls: list, device: str, iters: int) -> float | None:
    """Summed ms over the class's calls under `config`; None when any output differs from its reference."""
    from freetoken.kernels.tuning import override
    from kernel_timing import graph_time_ms

    total = 0.0
    with override(kernel, shape_class, config):
        for fn, ref, args in calls:
            try:
                out = fn(*args)
            except Exception as e:  # noqa: BLE001  a config the compiler refuses (shared memory, registers)
                print(f"  skip {config}: {type(e).__name__}: {str(e)[:120]}")
                return None
            want = ref(*args).float()
            if (out.float() - want).abs().max() > 2e-2 * want.abs().max().clamp(min=1e-6):
                print(f"  wrong output {config}")
                return None
            total += graph_time_ms(fn, args, device, iters)[0]
    return total


def _calls(device: str, dtype: torch.dtype, dry: bool) -> dict[tuple[str, str], list]:
    from freetoken import kernels as K

    g = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return (torch.randn(*shape, generator=g, device=device) * shape[-1] ** -0.5).to(dtype)

    out = {}
    for shape_class, shapes in (TINY_LINEAR if dry else LINEAR_SHAPES).items():
        out[("linear_decode", shape_class)] = [(K.linear, K.linear_ref, (randn(1, d_in), randn(d_out, d_in)))
                                               for d_out, d_in in shapes]
    ffn = []
    for D, I, picks in TINY_FFN if dry else FFN_SHAPES:
        slots = max(picks, 8)
        slot_ids = torch.randperm(slots, generator=g, device=device)[:picks].to(torch.int32)[None, :]
        weights = torch.rand(1, picks, generator=g, device=device)
        ffn.append((K.expert_ffn, K.expert_ffn_ref, (randn(1, D), slot_ids, weights, randn(slots, 2 * I, D),
                                                     randn(slots, D, I))))
    out[("expert_ffn_decode", "any")] = ffn
    return out


def tune(device: str, dtype: torch.dtype, out_path: Path, quick: bool, dry: bool, iters: int = 20) -> dict:
    """Measure, then write the winners under this device's name in out_path; returns {kernel: {class: config}}."""
    from freetoken.kernels.tuning import device_name, load_table

    grids = {"linear_decode": linear_grid(quick), "expert_ffn_decode": ffn_grid(quick)}
    if dry:
        grids = {k: dry_grid(v) for k, v in grids.items()}
    best: dict[str, dict] = {}
    for (kernel, shape_class), calls in _calls(device, dtype, dry).items():
        scored = []
        for i, config in enumerate(grids[kernel]):
            ms = _score(kernel, shape_class, config, calls, device, 1 if dry else iters)
            if ms is not None:
                scored.append((ms, i, config))
            print(f"{kernel} {shape_class}: {i + 1}/{len(grids[kernel])}", end="\r", flush=True)
        if not scored:
            raise ValueError(f"{kernel} {shape_class}: no candidate config ran correctly")
        ms, _, config = min(scored, key=lambda s: (s[0], s[1]))
        print(f"{kernel} {shape_class}: {ms:.4f} ms summed, {config}")
        best.setdefault(kernel, {})[shape_class] = config
    best["expert_ffn_quant_decode"] = {"any": best["expert_ffn_decode"]["any"]}  # same tiles until tuned apart
    name = device_name(torch.device(device))
    write_table(out_path, name, best)
    load_table.cache_clear()
    print(f"wrote {name!r} to {out_path}")
    return best


def write_table(out_path: Path, name: str, best: dict) -> None:
    """best merged under device `name` into out_path (else into a copy of the package's table), the rest kept.
    Atomic: an interrupted write leaves the old file whole (the tuned configs of every other device in it)."""
    from freetoken.io import write_atomic
    from freetoken.kernels.tuning import CONFIG_FILE

    table = json.loads((out_path if out_path.exists() else CONFIG_FILE).read_text())
    table.setdefault("devices", {})[name] = {**table.get("devices", {}).get(name, {}), **best}
    write_atomic(out_path, json.dumps(table, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU under the Triton interpreter")
    p.add_argument("--quick", action="store_true", help="a small candidate grid")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--out", help="config file to update (default: the package's tuned_configs.json)")
    a = p.parse_args(argv)
    if a.dry_run and "freetoken.kernels" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    from freetoken.kernels.tuning import CONFIG_FILE

    device = "cpu" if a.dry_run else "cuda"
    try:
        if a.dry_run and not a.out:
            raise ValueError("--dry-run writes its interpreter entry to --out PATH only (never the package's file)")
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("no CUDA device here: run with --dry-run on a CPU machine")
        tune(device, torch.float32 if a.dry_run else getattr(torch, a.dtype), Path(a.out or CONFIG_FILE),
             a.quick, a.dry_run)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
