"""ft bench bw: sustained bandwidths of the expert lanes; writes this machine's profile and names the split mode."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from freetoken.cli.common import print_json


def register(sub) -> None:
    p = sub.add_parser("bw", help="host, CPU-lane and PCIe bandwidths; writes the profile `--split auto` reads")
    p.add_argument("--quick", action="store_true", help="short runs over buffers just past the cache (~5 s)")
    p.add_argument("--seconds", type=float, help="seconds per reading (default 1, --quick 0.25)")
    p.add_argument("--repeats", type=int, default=3, help="readings per lane: the median is kept, a reading under "
                                                          "half the others' median is taken again (default 3)")
    p.add_argument("--threads", type=int, help="host threads of torch and the host kernels, as the engine's "
                                               "--threads (default: the physical cores); recorded in the profile")
    p.add_argument("--model", help="checkpoint directory: its expert geometry and weight format (the profile "
                                   "`ft serve --model DIR --split auto` then reads); replaces the next three flags")
    p.add_argument("--hidden", type=int, help="expert geometry: hidden size D (default: Qwen3-30B-A3B's 2048)")
    p.add_argument("--intermediate", type=int, help="expert intermediate size I (default: Qwen3-30B-A3B's 768)")
    p.add_argument("--format", dest="fmt", help="expert weight format: bf16 (default), fp16, fp32")
    p.add_argument("--misses-per-call", type=int, default=4,
                   help="missing experts per decode layer call: what the gather and the CPU lane each take per call")
    p.add_argument("--no-probe", action="store_true", help="skip the end-to-end decode probe")
    p.add_argument("--cache-dir", type=Path, help="where the profile goes (default $XDG_CACHE_HOME/freetoken)")
    p.add_argument("--no-save", action="store_true", help="measure and print only")
    p.add_argument("--json", action="store_true", help="print the profile as one JSON object")
    p.set_defaults(run=run)


def geometry_of(model: str):
    """The expert geometry and weight format a checkpoint directory's engine runs (config.json only)."""
    import json
    from pathlib import Path

    from freetoken.calibrate.lanes import Geometry
    from freetoken.sim.model_card import load_model_card

    card = load_model_card(model)
    if card.expert_format is not None:
        raise ValueError(f"--model {model}: packed experts ({card.expert_format.method} {card.expert_format.kind}); `ft bench bw` measures "
                         f"bf16 / fp16 / fp32 experts only")
    raw = json.loads((Path(model) / "config.json").read_text())
    dtype = raw.get("dtype") or raw.get("torch_dtype") or "bfloat16"
    fmt = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype)
    if fmt is None:
        raise ValueError(f"--model {model}: config.json dtype {dtype!r} is not one of float32, bfloat16, float16")
    return Geometry(card.hidden_size, card.expert_intermediate_size, fmt)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from freetoken.calibrate.bench import BenchConfig, run_bench
    from freetoken.calibrate.lanes import Geometry
    from freetoken.calibrate.profile import profile_path, save_profile
    from freetoken.io import folder_problem

    if args.model and any(v is not None for v in (args.hidden, args.intermediate, args.fmt)):
        raise ValueError("--model sets the expert geometry and format: drop --hidden / --intermediate / --format")

    geo = geometry_of(args.model) if args.model else Geometry(2048 if args.hidden is None else args.hidden,
                                                               768 if args.intermediate is None else args.intermediate,
                                                               args.fmt or "bf16")  # 0 is an error, not the default
    problem = folder_problem(Path(args.cache_dir)) if args.cache_dir and not args.no_save else None
    if problem:  # before the measuring, not after it
        raise ValueError(f"--cache-dir {args.cache_dir}: cannot write ({problem})")
    for flag, value in (("--repeats", args.repeats), ("--threads", args.threads), ("--seconds", args.seconds),
                        ("--misses-per-call", args.misses_per_call)):
        if value is not None and value <= 0:
            raise ValueError(f"{flag} must be positive, got {value:g}")
    from freetoken.engine.runtime import set_host_threads

    set_host_threads(args.threads)  # None: torch's (the physical cores by default), as the engine
    cfg = BenchConfig.quick(geo) if args.quick else BenchConfig(geo)
    cfg = replace(cfg, misses_per_call=args.misses_per_call, probe=cfg.probe and not args.no_probe,
                  repeats=args.repeats, **({"seconds": args.seconds} if args.seconds is not None else {}))
    log = (lambda s: None) if args.json else (lambda s: print(f"  measuring {s}", file=sys.stderr))
    profile = run_bench(cfg, log)
    path = None
    if not args.no_save:
        path = save_profile(profile, profile_path(profile["gpu"], geo.fmt, args.cache_dir))
    if args.json:
        print_json({**profile, "path": str(path) if path else None})
        return 0
    print_table(profile)
    if path:
        print(f"profile written to {path}")
    return 0


def print_table(p: dict) -> None:
    g = p["geometry"]
    print(f"expert {g['hidden']}x{g['intermediate']} {p['expert_format']}: {g['expert_bytes'] / 2**20:.1f} MiB; "
          f"{p['threads']} threads (host kernels {p['host_kernel_threads']}); LLC {p['llc_bytes'] / 2**20:.0f} MiB; "
          f"{p['repeats']} readings per lane")
    m = p["cpu_lane"]["experts_per_call"]
    rows = [("host memory read", p["host"]), (f"CPU lane, {m} experts/call", p["cpu_lane"])]
    if p["pcie"] is None:
        rows.append(("PCIe", None))
    else:
        rows += [("PCIe pinned bulk copy", p["pcie"]["h2d_bulk"]), ("PCIe expert gather", p["pcie"]["gather"]),
                 ("CPU lane while gathering", p["overlap"]["cpu_lane"]),
                 ("gather while CPU lane runs", p["overlap"]["gather"])]
    print(f"{'lane':28s} {'median GB/s':>12s} {'spread':>7s} {'readings GB/s':>24s} {'retried':>7s} "
          f"{'best pass':>10s}")
    for name, r in rows:
        if r is None:
            print(f"{name:28s} {'absent (no CUDA device)':>40s}")
            continue
        readings = " ".join(f"{x['gb_s']:.3g}" for x in r["readings"])
        print(f"{name:28s} {r['gb_s']:12.3g} {r['spread']:7.0%} {readings:>24s} {r['retried']:7d} "
              f"{r['peak_gb_s']:10.3g}")
    g = p.get("gpu_probe")
    if g:
        print(f"GPU probe: launch {g['launch_us']:.1f} us (+{g['dispatch_us']:.1f} us Triton dispatch), sync "
              f"{g['sync_us']:.1f} us, kernel floor {g['kernel_floor_us']:.2f} us, GEMM {g['gemm_tflops']:.0f} TFLOP/s, "
              f"GEMV {g['gemv_gb_s']:.0f} GB/s")
    else:
        print("GPU probe: absent (no CUDA device)")
    probe = p["decode_probe"]
    if probe:
        print(f"decode probe ({probe['model']}): offload {probe['offload_tok_s']:.2f} tok/s, "
              f"hybrid {probe['hybrid_tok_s']:.2f} tok/s")
    rec = p["recommendation"]
    print(f"recommended mode: {rec['mode']} ({rec['reason']})")
