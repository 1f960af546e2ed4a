"""ft predict: decode / prefill tok/s, TTFT and turn latency of a model on a machine under an engine."""

from __future__ import annotations

import argparse
from dataclasses import replace

from freetoken.cli.common import LazyChoices, print_json, progress

LATE_DEFAULTS = {  # flag -> (module, constant): read when the command runs, so building the parser stays light
    "prompt_tokens": ("sim.predict", "DEFAULT_PROMPT"),
    "decode_tokens": ("sim.predict", "DEFAULT_DECODE"),
    "skew": ("sim.predict", "SYNTH_SKEW"),
    "reuse": ("sim.predict", "SYNTH_REUSE"),
    "window": ("sim.predict", "SYNTH_WINDOW"),
    "min_context": ("freetoken.serve.memory", "DEFAULT_KV_FLOOR"),
}


def register(sub) -> None:
    p = sub.add_parser("predict", help="predict throughput and latency from a model card, a hardware profile "
                                       "and an engine (cost model over a replayed trace)")
    p.add_argument("--model", help="a name in conf/model (e.g. qwen3.5-122b-a10b), a .yaml path, or a local HF "
                                   "checkpoint directory (its config.json: shape, dtype, quantization_config)")
    p.add_argument("--expert-format", help="size the routed experts as this packed format (gptq-g128, fp8-block, "
                                           "nvfp4, ... freetoken.quant.FORMAT_SPECS) or bits name (int4, ...)")
    p.add_argument("--hardware", help="a name in conf/hardware (e.g. rtx5090-ryzen) or a .yaml path")
    p.add_argument("--engine", default="freetoken-offload", metavar="ENGINE",
                   choices=LazyChoices("sim.engines", "ENGINES"), help="one of %(choices)s")
    p.add_argument("--rule", choices=["balanced", "paper"],
                   help="hybrid engines: how many misses to fetch (balanced lanes, or the paper's q* = m BP / BH)")
    p.add_argument("--trace", help="routing trace of this model (.safetensors); default: a synthetic one of its shape")
    p.add_argument("--prompt-tokens", type=int, help="synthetic: prompt length")
    p.add_argument("--decode-tokens", type=int, help="synthetic: tokens generated")
    p.add_argument("--warmup-decode", type=int, default=0,
                   help="replay this many decode steps first, unreported, so the request meets the cache of a "
                        "running server (synthetic: more of the same routing; --trace: its last decode steps)")
    p.add_argument("--skew", type=float, help="synthetic: Zipf exponent of expert popularity")
    p.add_argument("--reuse", type=float, help="synthetic: probability a pick reuses a recent one")
    p.add_argument("--window", type=int, help="synthetic: tokens back a reuse looks")
    p.add_argument("--bw-profile", help="an `ft bench bw` profile (JSON) whose measured PCIe, CPU-lane and host "
                                        "bandwidths replace the hardware profile's")
    p.add_argument("--min-context", type=int, help="KV-cache floor in tokens")
    p.add_argument("--host", default="shared", metavar="MODE", choices=LazyChoices("sim.lanes", "HOST_MODES"),
                   help="PCIe DMA and CPU lane: share host DRAM bandwidth, or run independently (%(choices)s)")
    p.add_argument("--capacity", type=int, help="expert slots (default: what VRAM holds after dense weights and KV)")
    p.add_argument("--n-cpu-moe", type=int, help="llamacpp-ncmoe: MoE layers on the CPU (default: from VRAM)")
    p.add_argument("--anchors", action="store_true",
                   help="regenerate docs/anchors.md: predictions beside every published anchor cell")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.anchors:
        from sim.anchors import main as anchors_main

        return anchors_main([])
    if not args.model or not args.hardware:
        raise ValueError("--model and --hardware are required (or --anchors)")
    import importlib

    for flag, (module, name) in LATE_DEFAULTS.items():
        if getattr(args, flag) is None:
            setattr(args, flag, getattr(importlib.import_module(module), name))
    from freetoken.trace import load
    from sim.calls import num_calls
    from sim.engines import get_engine
    from sim.hardware import load_hardware
    from sim.model_card import load_model_card
    from sim.predict import check_shape, predict, synthetic_trace, warmup_split

    card, hw = load_model_card(args.model), load_hardware(args.hardware)
    if args.expert_format:
        card = card.with_quant(expert=args.expert_format)
    if args.bw_profile:
        from pathlib import Path

        from freetoken.calibrate.profile import load_profile
        from sim.hardware import with_bench_profile

        hw = with_bench_profile(hw, load_profile(Path(args.bw_profile)), args.bw_profile)
    engine = get_engine(args.engine)
    if args.rule:
        if engine.split != "hybrid":
            raise ValueError(f"--rule applies to hybrid engines, not {args.engine} (split {engine.split})")
        engine = replace(engine, rule=args.rule)
    if args.warmup_decode < 0:
        raise ValueError(f"--warmup-decode must be >= 0, got {args.warmup_decode}")
    if args.trace:
        trace = load(args.trace)
        check_shape(trace, card, args.trace)
    else:  # the warm-up continues the same synthetic routing (same hot experts), after the measured tokens
        trace = synthetic_trace(card, args.prompt_tokens, args.decode_tokens + args.warmup_decode, skew=args.skew,
                                reuse=args.reuse, window=args.window)
    warmup = None
    if args.warmup_decode:
        trace, warmup = warmup_split(trace, args.warmup_decode)
    n = num_calls(trace, engine.prefill_chunk) + (num_calls(warmup, engine.prefill_chunk) if warmup else 0)
    with progress(n, f"replaying {card.name} on {hw.name}", enabled=not args.json) as advance:
        pred = predict(card, hw, engine, trace, min_context=args.min_context, host=args.host,
                       n_cpu_layers=args.n_cpu_moe, capacity=args.capacity, on_call=None if args.json else advance,
                       warmup=warmup)
    pred.engine = args.engine + (f" (rule {args.rule})" if args.rule else "")
    if args.json:
        print_json(pred.to_dict())
        return 0
    print(f"{card.name} on {hw.name} ({hw.gpu}), engine {args.engine}: {engine.about}")
    print(f"  capacity {pred.capacity_experts} of {pred.total_experts} experts "
          f"({pred.capacity_experts / pred.total_experts:.0%}), miss rate prefill {pred.miss_rate_prefill:.1%} "
          f"decode {pred.miss_rate_decode:.1%}")
    print(f"  prefill {pred.prefill_tok_s:8.1f} tok/s  ({pred.prompt_tokens} tokens, TTFT {pred.ttft_s:.2f} s)")
    print(f"  decode  {pred.decode_tok_s:8.1f} tok/s  ({pred.decode_tokens} tokens)")
    print(f"  turn latency p50 {pred.turn_latency_p50_s:.2f} s, worst {pred.turn_latency_worst_s:.2f} s")
    busy = pred.lane_busy_s
    print(f"  lanes busy: gpu {busy['gpu']:.2f} s, pcie {busy['pcie']:.2f} s, cpu {busy['cpu']:.2f} s "
          f"(fetched {pred.fetched_gb:.1f} GB, cpu read {pred.cpu_gb:.1f} GB)")
    return 0
