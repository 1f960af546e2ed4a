"""ft sim: replay a routing trace through a placement policy and a miss split."""

from __future__ import annotations

import argparse

from freetoken.cli.common import LazyChoices, add_split_args, print_json, progress, split_from_args
from freetoken.paths import DEFAULT_TRACE


def register(sub) -> None:
    p = sub.add_parser("sim", help="replay a routing trace through a policy, a split and a cache capacity")
    p.add_argument("--trace", default=str(DEFAULT_TRACE),
                   help="trace file (.safetensors, see `ft trace import`); default: the shipped synthetic trace")
    p.add_argument("--policy", default="lru", metavar="NAME",
                   choices=LazyChoices("freetoken.placement", "POLICIES", sort=True),
                   help="placement policy: %(choices)s")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--capacity", type=int, help="GPU expert slots")
    size.add_argument("--fraction", type=float, help="GPU expert slots as a fraction of all experts, in (0, 1]")
    add_split_args(p)
    p.add_argument("--prefill-chunk", type=int, default=2048, help="tokens per prefill call")
    p.add_argument("--profile", help="frequency: trace whose expert counts choose the pinned set "
                                     "(default: the replayed trace, i.e. in-sample)")
    p.add_argument("--n-cpu-layers", type=int, help="static_layers: MoE layers kept on the CPU "
                                                      "(default: derived from the capacity)")
    p.add_argument("--scope", choices=["per_layer", "global", "unified"],
                   help="frequency: pin per layer or globally; lru: one pool (unified) or a quota per layer")
    p.add_argument("--pool-split", choices=["equal", "profile"],
                   help="lru --scope per_layer: equal quotas, or by the experts each layer uses on --profile")
    p.add_argument("--strategy", choices=["frequency", "uniform", "front_loading"],
                   help="frequency: KTransformers' placement strategy (uniform and front_loading need no profile)")
    p.add_argument("--expert-bytes", type=int, default=0, help="bytes per expert, for fetched_bytes")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from freetoken.trace import load
    from sim.calls import num_calls
    from sim.run import SimConfig, simulate

    trace = load(args.trace)
    profile = load(args.profile) if args.profile else None
    options = {}
    if args.n_cpu_layers is not None:
        options["n_cpu_layers"] = args.n_cpu_layers
    if args.scope is not None:
        options["scope"] = args.scope
    if args.strategy is not None:
        options["strategy"] = args.strategy
    if args.pool_split is not None:
        options["split"] = args.pool_split
    split = split_from_args(args)
    config = SimConfig(args.policy, split, args.capacity, args.fraction, args.prefill_chunk, args.expert_bytes,
                       options)
    n_calls = num_calls(trace, args.prefill_chunk)
    with progress(n_calls, f"replaying {trace.model}", enabled=not args.json) as advance:
        result = simulate(trace, config, profile, on_call=None if args.json else advance)
    out = result.to_dict()
    out["trace"] = args.trace
    if args.json:
        print_json(out)
        return 0
    t = result.total
    print(f"{args.trace}: {trace.num_tokens} tokens, {trace.num_layers} MoE layers x {trace.num_experts} experts, "
          f"top-{trace.top_k}")
    print(f"policy {result.policy}, split {result.split}, capacity {result.capacity} of {trace.num_keys} experts "
          f"({result.capacity / trace.num_keys:.1%})")
    print(f"  accesses {t.accesses}  hits {t.hits}  misses {t.misses}  hit rate {t.hit_rate:.2%}")
    print(f"  fetched {t.fetched}  cpu {t.cpu}  evictions {t.evictions}"
          + (f"  fetched bytes {t.fetched_bytes}" if args.expert_bytes else ""))
    for name, c in result.by_phase().items():
        print(f"  {name:8s} accesses {c.accesses}  hit rate {c.hit_rate:.2%}  fetched {c.fetched}  cpu {c.cpu}")
    return 0
