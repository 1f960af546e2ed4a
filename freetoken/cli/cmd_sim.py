"""ft sim: replay a routing trace through a placement policy and a miss split."""

from __future__ import annotations

import argparse

from freetoken.cli.common import add_cache_args, cache_config_from_args, print_json
from freetoken.progress import progress
from freetoken.paths import DEFAULT_TRACE


def register(sub) -> None:
    p = sub.add_parser("sim", help="replay a routing trace through a policy, a split and a cache capacity")
    p.add_argument("--trace", default=str(DEFAULT_TRACE),
                   help="trace file (.safetensors, see `ft trace import`); default: the shipped synthetic trace")
    add_cache_args(p)
    p.add_argument("--expert-bytes", type=int, default=0, help="bytes per expert, for fetched_bytes")
    p.add_argument("--batch", type=int, default=1, help="replay requests N at a time as the server's continuous "
                                                         "batching runs them (decode steps over their union)")
    p.add_argument("--draft-depth", type=int, default=0,
                   help="speculative decoding: tokens drafted per decode step; each step one verify call of d + 1 "
                        "tokens (default 0: none)")
    p.add_argument("--acceptance", type=float, default=1.0,
                   help="with --draft-depth: chance a drafted token is the true next one (else another token of "
                        "the sequence); default 1")
    p.add_argument("--draft-seed", type=int, default=0, help="seed of the drafts' acceptance draws")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from freetoken.placement import is_compiled
    from freetoken.sim.run import SimConfig, call_stream, simulate
    from freetoken.trace import load

    if args.acceptance != 1.0 and not args.draft_depth:
        raise ValueError("--acceptance needs --draft-depth (the drafts it accepts)")
    config = cache_config_from_args(args, SimConfig, expert_bytes=args.expert_bytes, batch=args.batch,
                                    draft_depth=args.draft_depth, acceptance=args.acceptance,
                                    draft_seed=args.draft_seed)  # flags checked before any loading
    trace = load(args.trace)
    stream, steps = call_stream(trace, config)  # drawn once: counted for the progress bar, then replayed
    interpreted = "hint" in config.options or config.options.get("measure")  # Python hint objects, the tally
    if (interpreted or not is_compiled(config.policy)) and not args.json:
        why = ": these options run" if interpreted else " has no compiled decision; it runs"
        print(f"note: policy {config.policy}{why} interpreted (slow path)", flush=True)
    with progress(stream.num_calls, f"replaying {trace.model}", enabled=not args.json) as advance:
        result = simulate(trace, config, on_call=None if args.json else advance, stream=stream, steps=steps)
    out = result.to_dict()
    out["trace"] = args.trace
    spec = steps if config.draft_depth else None  # the verify steps (a batched step: its sequences' together)
    if spec is not None:
        out["speculation"] = {"draft_depth": config.draft_depth, "acceptance": config.acceptance,
                              "batch": config.batch, "verify_steps": spec.verify_steps,
                              "decode_tokens": spec.decode_tokens, "accepted_drafts": int(spec.accepted.sum())}
    if args.json:
        print_json(out)
        return 0
    t = result.total
    print(f"{args.trace}: {trace.num_tokens} tokens, {trace.num_layers} MoE layers x {trace.num_experts} experts, "
          f"top-{trace.top_k}")
    print(f"policy {result.policy}, split {result.split}, capacity {result.capacity} of {trace.num_keys} experts "
          f"({result.capacity / trace.num_keys:.1%})")
    print(f"  accesses {t.accesses}  hits {t.hits}  misses {t.misses}  hit rate {t.hit_rate:.2%}")
    # prefetched copies cross PCIe too: a policy that prefetches is not cheaper than its miss count alone says
    print(f"  fetched {t.fetched}  prefetched {t.prefetched}  transfers {t.fetched + t.prefetched}  cpu {t.cpu}  "
          f"evictions {t.evictions}" + (f"  fetched bytes {t.fetched_bytes}" if args.expert_bytes else ""))
    if spec is not None:
        print(f"  speculation: depth {config.draft_depth}, acceptance {config.acceptance}: {spec.verify_steps} "
              f"verify steps for {spec.decode_tokens} decode tokens "
              f"({spec.decode_tokens / max(spec.verify_steps, 1):.2f} per step"
              + (f", {config.batch} sequences a step)" if config.batch > 1 else ")"))
    for name, c in result.by_phase().items():
        print(f"  {name:8s} accesses {c.accesses}  hit rate {c.hit_rate:.2%}  fetched {c.fetched}  "
              f"prefetched {c.prefetched}  cpu {c.cpu}")
    return 0
