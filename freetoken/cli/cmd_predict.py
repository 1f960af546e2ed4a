"""ft predict: decode / prefill tok/s, TTFT and turn latency of a model on a machine under an engine."""

from __future__ import annotations

import argparse
from dataclasses import replace

from freetoken.cli.common import LazyChoices, add_size_args, print_json
from freetoken.progress import progress
from freetoken.kv_dtype import KV_DTYPE_HELP, check_kv_dtype


LATE_DEFAULTS = {  # flag -> (module, constant): read when the command runs, so building the parser stays light
    "prompt_tokens": ("freetoken.sim.predict", "DEFAULT_PROMPT"),
    "decode_tokens": ("freetoken.sim.predict", "DEFAULT_DECODE"),
    "skew": ("freetoken.sim.predict", "SYNTH_SKEW"),
    "reuse": ("freetoken.sim.predict", "SYNTH_REUSE"),
    "window": ("freetoken.sim.predict", "SYNTH_WINDOW"),
    "kv_floor": ("freetoken.sim.planner", "DEFAULT_KV_FLOOR"),
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
                   choices=LazyChoices("freetoken.sim.engines", "ENGINES"), help="one of %(choices)s")
    p.add_argument("--rule", choices=["balanced", "paper"],
                   help="hybrid engines: how many misses to fetch (balanced lanes, or the paper's q* = m BP / BH)")
    p.add_argument("--trace", help="routing trace of this model (.safetensors); default: a synthetic one of its shape")
    p.add_argument("--workload", default="single", metavar="WORKLOAD",
                   choices=LazyChoices("freetoken.sim.agent", "WORKLOADS"),
                   help="synthetic workload: single (one prompt, one answer: --prompt-tokens, --decode-tokens) or "
                        "a turn-structured agent session with KV reuse (sim.agent)")
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
    p.add_argument("--kv-floor", "--min-context", dest="kv_floor", type=int,
                   help="KV tokens reserved before any expert slot")
    p.add_argument("--host", default="shared", metavar="MODE", choices=LazyChoices("freetoken.sim.lanes", "HOST_MODES"),
                   help="PCIe DMA and CPU lane: share host DRAM bandwidth, or run independently (%(choices)s)")
    add_size_args(p, "what VRAM holds after dense weights and the KV floor")
    cpu = p.add_mutually_exclusive_group()
    cpu.add_argument("--cpu-moe", action="store_true", help="llamacpp engines: every MoE layer's experts on the CPU")
    cpu.add_argument("--n-cpu-moe", "--n-cpu-layers", dest="n_cpu_moe", type=int, metavar="N",
                     help="llamacpp engines: the first N MoE layers' experts on the CPU (default: from VRAM)")
    # engine settings (sim.engines.with_settings): what the run being predicted used
    p.add_argument("--prefill-chunk", type=int, help="tokens per prefill call (freetoken, ktransformers; default 2048)")
    p.add_argument("--ubatch", type=int, help="llama.cpp -ub: tokens per prefill call (default 512)")
    p.add_argument("--gguf-type", help="llama.cpp GGUF type of the model file: q4_k_m (default), q8_0, bf16, ...")
    p.add_argument("--cuda-graphs", choices=["on", "off"], help="decode as captured CUDA graphs (default: the "
                                                                "engine's: llama.cpp, ktransformers, resident on)")
    p.add_argument("--double-buffer", choices=["on", "off"],
                   help="freetoken-offload: prefill streams layer l+1's non-resident experts while layer l computes "
                        "(two layers of staging slots; default off, as the engine's planner reserves one)")
    p.add_argument("--decode-overlap", choices=["on", "off"],
                   help="decode's expert copies beside the resident experts' compute (default on); off: on the "
                        "compute stream before every expert GEMM (FreeToken 0.1.2's gather kernel)")
    p.add_argument("--decode-gather-gb-s", type=float, metavar="GB_S",
                   help="decode's expert copies at this rate instead of the PCIe rate BP (an SM gather kernel "
                        "reading pinned host memory, capped by BP: FreeToken 0.1.2's, ~31 GB/s); 0: at BP")
    p.add_argument("--prefill-split", metavar="MODE", choices=LazyChoices("freetoken.sim.engines", "PREFILL_SPLITS"),
                   help="how prefill calls split their misses (%(choices)s): same as decode (default; "
                        "freetoken-hybrid: a CPU lane in prefill too) or offload, every miss fetched (FreeToken "
                        "0.1.2's hybrid)")
    p.add_argument("--prefill-copies", metavar="WHAT", choices=LazyChoices("freetoken.sim.engines", "PREFILL_COPIES"),
                   help="what a prefill call copies over PCIe (%(choices)s): its layer's missing experts (default) or "
                        "every expert of its layer (FreeToken 0.1.2's full-layer loading)")
    p.add_argument("--cpu-threads", type=int, help="CPU-lane threads (scales the CPU FLOP rate; needs cpu_cores)")
    p.add_argument("--amx", action="store_true", help="KTransformers' AMX CPU kernels (hardware cpu_amx_tflops)")
    p.add_argument("--kv-dtype", default="auto", help=KV_DTYPE_HELP)
    p.add_argument("--draft-depth", type=int, help="speculative decoding / MTP: tokens drafted per step (sim.batch)")
    p.add_argument("--acceptance", type=float, help="speculative decoding: acceptance rate of a drafted token")
    p.add_argument("--batch", type=int, help="also decode this many synthetic sequences in lockstep (sim.batch)")
    p.add_argument("--no-band", action="store_true",
                   help="skip the band (the prediction again under three other routing localities)")
    p.add_argument("--anchors", action="store_true",
                   help="regenerate docs/anchors.md: predictions beside every published anchor cell")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


UNSTATED_CONTEXT = 1 << 20  # the longest context of the models shipped here (DeepSeek-V4: 1,048,576 positions)


def check_tokens(card, prompt: int, decode: int, warmup: int) -> None:
    """The synthetic request must fit what the model can hold: its context (config.json max_position_embeddings),
    else, for a card that states none, the longest context of the shipped models. Checked before any trace is
    drawn (a trillion-token request was killed for memory)."""
    if prompt < 0 or decode < 0 or prompt + decode == 0:
        raise ValueError(f"--prompt-tokens and --decode-tokens must be >= 0 and not both 0, got {prompt}, {decode}")
    total = prompt + decode + warmup
    limit = card.max_context or UNSTATED_CONTEXT
    if total > limit:
        held = (f"its context of {limit:,} tokens (config.json max_position_embeddings)" if card.max_context
                else f"{limit:,} tokens (the card states no context; the longest of the shipped models)")
        raise ValueError(f"--prompt-tokens {prompt:,} + --decode-tokens {decode:,}"
                         + (f" + --warmup-decode {warmup:,}" if warmup else "")
                         + f" = {total:,} tokens: more than model {card.name} can hold, {held}")


def engine_from_args(args: argparse.Namespace):
    from freetoken.sim.engines import get_engine, with_settings

    engine = get_engine(args.engine)
    if args.ubatch is not None and engine.host_work != "llamacpp":
        raise ValueError("--ubatch applies to llama.cpp engines (llamacpp-*); use --prefill-chunk")
    if args.prefill_chunk is not None and args.ubatch is not None:
        raise ValueError("give one of --prefill-chunk and --ubatch")
    def on_off(value: str | None) -> bool | None:  # an on|off flag; None: the engine's own setting
        return None if value is None else value == "on"

    graphs, double, decode_overlap = on_off(args.cuda_graphs), on_off(args.double_buffer), on_off(args.decode_overlap)
    return with_settings(engine, prefill_chunk=args.prefill_chunk if args.ubatch is None else args.ubatch,
                         gguf_type=args.gguf_type, expert_format=args.expert_format, cuda_graphs=graphs,
                         cpu_threads=args.cpu_threads, amx=True if args.amx else None,
                         kv_dtype=check_kv_dtype(args.kv_dtype), double_buffer=double,
                         decode_overlap=decode_overlap, prefill_split=args.prefill_split,
                         decode_gather_gb_s=args.decode_gather_gb_s, prefill_copies=args.prefill_copies)


def decode_variants(args, card, hw, engine, trace, warmup, pred, kw: dict) -> None:
    """--draft-depth / --acceptance and --batch: the same model, machine and engine decoding otherwise."""
    from freetoken.sim.batch import Speculation, predict_batched, predict_speculative
    from freetoken.sim.predict import synthetic_trace

    if (args.draft_depth is None) != (args.acceptance is None):
        raise ValueError("give both --draft-depth and --acceptance (speculative decoding)")
    if args.draft_depth is not None:
        spec = Speculation(args.draft_depth, args.acceptance)
        r = predict_speculative(card, hw, engine, trace, spec, pred.decode_tok_s, warmup, args.host, **kw)
        pred.variants["speculative"] = {"tok_s": r.tok_s, "steps": r.steps, "tokens_per_step": spec.tokens_per_step,
                                        "about": f"depth {spec.depth}, acceptance {spec.acceptance}: "
                                                 f"{spec.tokens_per_step:.2f} tokens per verify step"}
    if args.batch is not None:
        if args.batch < 1 or args.trace:
            raise ValueError("--batch needs a positive count and a synthetic workload (no --trace)")
        traces = [synthetic_trace(card, args.prompt_tokens, args.decode_tokens, skew=args.skew, reuse=args.reuse,
                                  window=args.window, seed=s) for s in range(args.batch)]
        r = predict_batched(card, hw, engine, traces, args.host, **kw)
        pred.variants["batched"] = {"tok_s": r.tok_s, "per_sequence_tok_s": r.per_sequence_tok_s,
                                    "seconds_per_token": r.seconds_per_token,
                                    "about": f"{args.batch} sequences in lockstep, {r.per_sequence_tok_s:.1f} tok/s "
                                             f"each, cold cache"}


def run(args: argparse.Namespace) -> int:
    if args.anchors:
        from freetoken.sim.anchors import main as anchors_main

        return anchors_main([])
    if not args.model or not args.hardware:
        raise ValueError("--model and --hardware are required (or --anchors)")
    import importlib

    for flag, (module, name) in LATE_DEFAULTS.items():
        if getattr(args, flag) is None:
            setattr(args, flag, getattr(importlib.import_module(module), name))
    import importlib

    for flag, (module, name) in LATE_DEFAULTS.items():
        if getattr(args, flag) is None:
            setattr(args, flag, getattr(importlib.import_module(module), name))
    from freetoken.trace import load
    from freetoken.sim.calls import num_calls
    from freetoken.sim.hardware import load_hardware
    from freetoken.sim.model_card import load_model_card
    from freetoken.sim.predict import check_shape, predict, synthetic_trace, warmup_split

    card, hw = load_model_card(args.model), load_hardware(args.hardware)
    if args.bw_profile:
        from pathlib import Path

        from freetoken.calibrate.profile import load_profile
        from freetoken.sim.hardware import with_bench_profile

        hw = with_bench_profile(hw, load_profile(Path(args.bw_profile)), args.bw_profile)
    engine = engine_from_args(args)
    capacity = None
    if args.capacity is not None or args.fraction is not None:  # the one cache config's rule, on the card's experts
        from freetoken.cli.common import CLI_NAMES
        from freetoken.placement import cache_config

        size = cache_config(CLI_NAMES, capacity=args.capacity, fraction=args.fraction)
        capacity = size.slots_for(card.moe_layers, card.num_experts)
    n_cpu = card.moe_layers if args.cpu_moe else args.n_cpu_moe
    sizing = dict(min_context=args.kv_floor, n_cpu_layers=n_cpu, capacity=capacity)
    if args.rule:
        if engine.split != "hybrid":
            raise ValueError(f"--rule applies to hybrid engines, not {args.engine} (split {engine.split})")
        engine = replace(engine, rule=args.rule)
    if args.warmup_decode < 0:
        raise ValueError(f"--warmup-decode must be >= 0, got {args.warmup_decode}")
    if not args.trace and args.workload == "single":
        check_tokens(card, args.prompt_tokens, args.decode_tokens, args.warmup_decode)
    if args.trace and args.workload != "single":
        raise ValueError("--workload draws a synthetic trace; it cannot be combined with --trace")

    def make_trace(**routing):  # the warm-up continues the same synthetic routing, after the measured tokens
        if args.workload != "single":
            from freetoken.sim.agent import agent_trace, workload_turns

            return agent_trace(card, workload_turns(args.workload), args.warmup_decode, **routing)
        return synthetic_trace(card, args.prompt_tokens, args.decode_tokens + args.warmup_decode, **routing)

    if args.trace:
        trace = load(args.trace)
        check_shape(trace, card, args.trace)
    else:
        trace = make_trace(skew=args.skew, reuse=args.reuse, window=args.window)
    warmup = None
    if args.warmup_decode:
        trace, warmup = warmup_split(trace, args.warmup_decode)
    n = num_calls(trace, engine.prefill_chunk) + (num_calls(warmup, engine.prefill_chunk) if warmup else 0)
    with progress(n, f"replaying {card.name} on {hw.name}", enabled=not args.json) as advance:
        pred = predict(card, hw, engine, trace, host=args.host, on_call=None if args.json else advance,
                       warmup=warmup, **sizing)
    pred.engine = args.engine + (f" (rule {args.rule})" if args.rule else "")
    decode_variants(args, card, hw, engine, trace, warmup, pred, sizing)
    if not args.no_band:
        from freetoken.sim.band import locality_band

        if args.trace:  # the band draws synthetic traces of the trace's lengths
            prompt, decode = pred.prompt_tokens, pred.decode_tokens
            make_trace = lambda **r: synthetic_trace(card, prompt, decode + args.warmup_decode, **r)  # noqa: E731
        with progress(3, "band: three other routing localities", enabled=not args.json) as advance:
            pred.band = locality_band(card, hw, engine, make_trace, pred, args.warmup_decode,
                                      host=args.host, on_call=None, **sizing)
            advance(3)
    if args.json:
        print_json(pred.to_dict())
        return 0
    print(f"{card.name} on {hw.name} ({hw.gpu}), engine {args.engine}: {engine.about}")
    print(f"  capacity {pred.capacity_experts} of {pred.total_experts} experts "
          f"({pred.capacity_experts / pred.total_experts:.0%}), miss rate prefill {pred.miss_rate_prefill:.1%} "
          f"decode {pred.miss_rate_decode:.1%}")
    print(f"  KV cache {args.kv_dtype}: {pred.inputs['kv_bytes_per_token']} bytes per token "
          f"({args.kv_floor}-token floor before expert slots)")
    band = pred.band
    rng = (lambda m, f: f"  [{f.format(band[m][0])} .. {f.format(band[m][1])} over routing localities]"
           if band else "")
    print(f"  prefill {pred.prefill_tok_s:8.1f} tok/s  ({pred.prompt_tokens} tokens, TTFT {pred.ttft_s:.2f} s)"
          + rng("prefill_tok_s", "{:.1f}"))
    print(f"  decode  {pred.decode_tok_s:8.1f} tok/s  ({pred.decode_tokens} tokens)" + rng("decode_tok_s", "{:.1f}"))
    print(f"  turn latency p50 {pred.turn_latency_p50_s:.2f} s, worst {pred.turn_latency_worst_s:.2f} s"
          + rng("turn_latency_worst_s", "{:.2f}"))
    if args.workload != "single":
        print(f"  per request: mean decode {pred.decode_tok_s_turn_mean:.1f} tok/s over turns, mean TTFT "
              f"{pred.ttft_s:.2f} s" + rng("ttft_s", "{:.2f}") + f", worst turn {pred.turn_latency_worst_s:.2f} s")
    work = pred.inputs.get("host_work_per_decode_token")
    if work:
        print(f"  per decode token: {work['launches']:.0f} kernel launches, {work['syncs']:.0f} host syncs, "
              f"{work['copies']:.0f} copies (launch {hw.launch_us:g} us + dispatch {engine.dispatch_us:g} us, "
              f"sync {hw.sync_us:g} us)")
    for name, v in pred.variants.items():
        print(f"  {name} decode: {v['tok_s']:.1f} tok/s ({v['about']})")
    busy = pred.lane_busy_s
    print(f"  lanes busy: gpu {busy['gpu']:.2f} s, pcie {busy['pcie']:.2f} s, cpu {busy['cpu']:.2f} s "
          f"(fetched {pred.fetched_gb:.1f} GB, cpu read {pred.cpu_gb:.1f} GB)")
    return 0
