"""ft trace: import routing logs, summarise a trace, generate synthetic traces."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING

from freetoken.cli.common import LazyChoices, check_output, print_json
from freetoken.progress import progress
from freetoken.defaults import DEFAULT_PREFILL_CHUNK, check_prefill_chunk

if TYPE_CHECKING:
    from freetoken.trace import RoutingTrace


def register(sub) -> None:
    p = sub.add_parser("trace", help="routing traces: import, info, synth")
    tsub = p.add_subparsers(dest="trace_command", metavar="ACTION")
    tsub.required = True
    imp = tsub.add_parser("import", help="convert a routing log (JSONL, JSON, NPZ) to a .safetensors trace")
    imp.add_argument("src", help="routing log")
    imp.add_argument("out", help="trace file to write (.safetensors)")
    imp.add_argument("--format", metavar="FORMAT", choices=LazyChoices("freetoken.trace.importers", "IMPORTERS", True),
                     help="source format, one of %(choices)s (default: read from the file)")
    imp.add_argument("--incomplete", metavar="WHAT",
                     choices=LazyChoices("freetoken.trace.importers.mixtral_jsonl", "INCOMPLETE"),
                     help="mixtral_jsonl: tokens lacking some layers are dropped (default, counted) or an error "
                          "(%(choices)s)")
    imp.add_argument("--phase", choices=["prefill", "decode"],
                     help="mixtral_jsonl (its rows do not record the phase): the phase of every token (default "
                          "decode: the logs are one router decision per generated token)")
    imp.add_argument("--model", help="model name to record (default: the importer's)")
    imp.set_defaults(run=run_import)

    info = tsub.add_parser("info", help="shape, phases, per-layer popularity skew, reuse distances")
    info.add_argument("path", help="trace file (.safetensors)")
    info.add_argument("--prefill-chunk", type=int, default=DEFAULT_PREFILL_CHUNK,
                      help="tokens per prefill call for the call-granular reuse distances")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(run=run_info)

    syn = tsub.add_parser("synth", help="write a synthetic trace (Zipf popularity per layer, temporal reuse)")
    syn.add_argument("out", help="trace file to write (.safetensors)")
    syn.add_argument("--layers", type=int, help="MoE layers (default with --fit: the real trace's)")
    syn.add_argument("--experts", type=int, help="routed experts per layer")
    syn.add_argument("--top-k", type=int, help="experts per token")
    syn.add_argument("--tokens", type=int, help="tokens in all")
    syn.add_argument("--requests", type=int, help="requests (equal lengths; default 4)")
    syn.add_argument("--prefill-share", type=float, help="share of each request's tokens in prefill (default 0.5)")
    syn.add_argument("--skew", help="Zipf exponent of popularity: one number, or one per layer comma-separated "
                                    "(default 1.0)")
    syn.add_argument("--reuse", type=float, help="probability a top-k slot re-picks a recent expert (default 0.3)")
    syn.add_argument("--window", type=int, help="tokens back that re-picks look (default 4)")
    syn.add_argument("--seed", type=int, default=0)
    syn.add_argument("--model", help="model name to record")
    syn.add_argument("--fit", metavar="REAL_TRACE",
                     help="fit skew, reuse and window (and default shape) to this trace (.safetensors or any "
                          "importable log)")
    syn.set_defaults(run=run_synth)


# import
def run_import(args: argparse.Namespace) -> int:
    from freetoken.trace import save
    from freetoken.trace.importers import detect_format, import_trace

    _check_out(args.out)
    fmt = args.format or detect_format(args.src)
    options = {}
    if args.incomplete is not None:
        if fmt != "mixtral_jsonl":
            raise ValueError(f"--incomplete applies to the mixtral_jsonl format, not {fmt}")
        options["incomplete"] = args.incomplete
    if args.phase is not None:
        if fmt != "mixtral_jsonl":
            raise ValueError(f"--phase applies to the mixtral_jsonl format, whose rows do not record it; {fmt} "
                             f"records each token's phase")
        options["phase"] = args.phase
    trace = import_trace(args.src, fmt, model=args.model, **options)
    path = save(trace, args.out)
    print(f"wrote {path}: {_shape_line(trace)} (format {fmt})")
    if "phase" in trace.extra:
        print(f"phase: {trace.extra['phase']}")
    dropped = int(trace.extra.get("dropped_tokens", "0"))
    why = trace.extra.get("dropped_why", "")
    print(f"dropped {dropped} tokens" + (f": {why}" if dropped and why else ""))
    if "duplicate_rows" in trace.extra:
        print(f"  {trace.extra['duplicate_rows']} rows repeated a (problem, token, layer) already logged")
    return 0


# info
def trace_info(trace: RoutingTrace, prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> dict:
    import numpy as np

    from freetoken.trace import DECODE, PREFILL

    from freetoken.trace.stats import popularity_skew
    from freetoken.sim.reuse import reuse_stats

    check_prefill_chunk(prefill_chunk, "--prefill-chunk")
    empty = trace.num_tokens == 0  # no accesses: popularity and reuse are undefined (null), not Gini -1.1 or NaN

    def reuse(chunk: int) -> dict:  # a percentile without a warm access is null (JSON has no NaN)
        return {k: None if isinstance(v, float) and math.isnan(v) else v
                for k, v in reuse_stats(trace, chunk).to_dict().items()}

    return {
        "model": trace.model, "source": trace.source,
        "tokens": trace.num_tokens, "requests": int(len(np.unique(trace.request))),
        "phases": {"prefill": int((trace.phase == PREFILL).sum()), "decode": int((trace.phase == DECODE).sum())},
        "layers": trace.num_layers, "experts": trace.num_experts, "top_k": trace.top_k,
        "gates": trace.gates is not None,
        "skew": None if empty else popularity_skew(trace).summary(),
        "reuse_token": reuse(1),
        "reuse_calls": {"prefill_chunk": prefill_chunk, **reuse(prefill_chunk)},
        "extra": dict(trace.extra),
    }


def run_info(args: argparse.Namespace) -> int:
    from freetoken.trace import load

    info = trace_info(load(args.path), args.prefill_chunk)
    if args.json:
        print_json(info)
        return 0
    print(f"{args.path}: {info['model']} (source {info['source']})")
    print(f"  {info['tokens']} tokens, {info['requests']} requests, prefill {info['phases']['prefill']}, "
          f"decode {info['phases']['decode']}; {info['layers']} layers x {info['experts']} experts, "
          f"top-{info['top_k']}" + (", gates" if info["gates"] else ""))
    if info["skew"] is None:
        print("  no tokens: no popularity or reuse statistics")
        return 0
    print("  per-layer popularity (mean [min, max] over layers):")
    labels = {"top10": "share of top 10% experts", "top25": "share of top 25% experts", "gini": "Gini",
              "entropy": "entropy / log(E)"}
    for key, label in labels.items():
        s = info["skew"][key]
        print(f"    {label:26s} {s['mean']:.3f} [{s['min']:.3f}, {s['max']:.3f}]")
    print("  reuse distance (accesses between two uses of a (layer, expert) key):")
    for key, label in (("reuse_token", "per token"), ("reuse_calls", f"per call, chunk {args.prefill_chunk}")):
        r = info[key]
        spread = "  ".join(f"{p} {r[p]:.0f}" for p in ("p50", "p90", "p99")) if r["p50"] is not None \
            else "no key used twice"
        print(f"    {label:26s} {spread}  cold {r['cold_share']:.2%} of {r['accesses']} accesses")
    if "dropped_tokens" in info["extra"]:
        print(f"  dropped at import: {info['extra']['dropped_tokens']} tokens")
    return 0


# synth
def run_synth(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from freetoken.sim.synth import FIT_CANDIDATES, SynthSpec, fit_spec, synthesize
    from freetoken.trace import save
    from freetoken.trace.importers import read_any

    _check_out(args.out)
    shape = {"num_layers": args.layers, "num_experts": args.experts, "top_k": args.top_k,
             "num_tokens": args.tokens, "num_requests": args.requests, "prefill_share": args.prefill_share,
             "reuse": args.reuse, "window": args.window, "model": args.model}
    given = {k: v for k, v in shape.items() if v is not None}
    if args.skew is not None:
        given["skew"] = _parse_skew(args.skew)
    if args.fit:
        real = read_any(args.fit)
        with progress(FIT_CANDIDATES, f"fitting to {Path(args.fit).name}") as advance:
            spec = fit_spec(real, seed=args.seed, on_candidate=advance)
        if "num_layers" in given and given["num_layers"] != spec.num_layers and "skew" not in given:
            given["skew"] = round(float(sum(spec.layer_skews()) / spec.num_layers), 3)  # one exponent for all
        spec = replace(spec, seed=args.seed, **given)
        print(f"fitted to {args.fit}: reuse {spec.reuse}, window {spec.window}, skew mean "
              f"{spec.layer_skews().mean():.3f}")
    else:
        missing = [f"--{n}" for n, k in (("layers", "num_layers"), ("experts", "num_experts"),
                                         ("top-k", "top_k"), ("tokens", "num_tokens")) if k not in given]
        if missing:
            raise ValueError(f"give {', '.join(missing)} (or --fit REAL_TRACE to take the shape from a trace)")
        spec = SynthSpec(seed=args.seed, **given)
    trace = synthesize(spec)
    path = save(trace, args.out)
    print(f"wrote {path}: {_shape_line(trace)}")
    return 0


def _parse_skew(text: str) -> float | tuple[float, ...]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"--skew must be a number or comma-separated numbers, got {text!r}") from None
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"--skew must be finite, got {text!r}")
    return values[0] if len(values) == 1 else tuple(values)


def _check_out(out: str) -> None:
    if not out.endswith(".safetensors"):
        raise ValueError(f"{out}: the output trace must be a .safetensors file")
    check_output(out, "")


def _shape_line(trace: RoutingTrace) -> str:
    import numpy as np

    from freetoken.trace import DECODE

    n_dec = int((trace.phase == DECODE).sum())
    return (f"{trace.num_tokens} tokens ({trace.num_tokens - n_dec} prefill, {n_dec} decode), "
            f"{len(np.unique(trace.request))} requests, {trace.num_layers} MoE layers x {trace.num_experts} experts, "
            f"top-{trace.top_k}")
