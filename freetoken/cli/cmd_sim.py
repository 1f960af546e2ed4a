"""ft sim: replay a routing trace through a placement policy and a miss split."""

from __future__ import annotations

import argparse

from freetoken.cli.common import add_cache_args, cache_config_from_args, print_json, progress
from freetoken.paths import DEFAULT_TRACE


def register(sub) -> None:
    p = sub.add_parser("sim", help="replay a routing trace through a policy, a split and a cache capacity")
    p.add_argument("--trace", default=str(DEFAULT_TRACE),
                   help="trace file (.safetensors, see `ft trace import`); default: the shipped synthetic trace")
    add_cache_args(p)
    p.add_argument("--expert-bytes", type=int, default=0, help="bytes per expert, for fetched_bytes")
    p.add_argument("--batch", type=int, default=1, help="replay requests N at a time as the server's continuous "
                                                         "batching runs them (decode steps over their union)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from freetoken.placement import is_compiled
    from freetoken.sim.calls import num_calls
    from freetoken.sim.run import SimConfig, simulate
    from freetoken.trace import load

    config = cache_config_from_args(args, SimConfig, expert_bytes=args.expert_bytes, batch=args.batch)  # flags checked before any loading
    trace = load(args.trace)
    n_calls = num_calls(trace, config.prefill_chunk) if config.batch == 1 else \
        sum(1 for _ in config.batched_calls(trace))
    if not is_compiled(config.policy) and not args.json:
        print(f"note: policy {config.policy} has no compiled decision; it runs interpreted (slow path)", flush=True)
    with progress(n_calls, f"replaying {trace.model}", enabled=not args.json) as advance:
        result = simulate(trace, config, on_call=None if args.json else advance)
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
    # prefetched copies cross PCIe too: a policy that prefetches is not cheaper than its miss count alone says
    print(f"  fetched {t.fetched}  prefetched {t.prefetched}  transfers {t.fetched + t.prefetched}  cpu {t.cpu}  "
          f"evictions {t.evictions}" + (f"  fetched bytes {t.fetched_bytes}" if args.expert_bytes else ""))
    for name, c in result.by_phase().items():
        print(f"  {name:8s} accesses {c.accesses}  hit rate {c.hit_rate:.2%}  fetched {c.fetched}  "
              f"prefetched {c.prefetched}  cpu {c.cpu}")
    return 0
