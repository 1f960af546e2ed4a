"""Placement policies (which experts hold GPU slots) and miss splits, shared by the simulator and the engine."""

from __future__ import annotations

from freetoken.placement.call import DECODE, PREFILL, Call, Plan
from freetoken.placement.carry import LiveCarry
from freetoken.placement.callstream import CallStream, call_stream, make_call
from freetoken.placement.compiled.policy import CompiledPolicy
from freetoken.placement.config import (DEFAULT_PREFILL_CHUNK, CacheConfig, build_policy, cache_config,
                                        constructor_options)
from freetoken.placement.counts import Counts
from freetoken.placement.policies.belady import Belady
from freetoken.placement.policies.frequency import Frequency
from freetoken.placement.policies.ktransformers_dynamic import KTransformersDynamic
from freetoken.placement.policies.lru import LRU
from freetoken.placement.policies.moe_infinity import MoEInfinity
from freetoken.placement.policies.s3fifo import S3FIFO
from freetoken.placement.policies.static_layers import StaticLayers
from freetoken.placement.policies.sweep.hinted_sweep import HintedSweep
from freetoken.placement.policies.sweep.layer_sweep import LayerSweep
from freetoken.placement.policies.sweep.lookahead import Lookahead
from freetoken.placement.policy import NOT_RESIDENT, PlacementPolicy
from freetoken.placement.split import FETCH_ORDERS, Split, balanced_fetch_count, paper_fetch_count
from freetoken.placement.stream import KeyStream, key_stream

POLICIES: dict[str, type[PlacementPolicy]] = {
    "lru": LRU,
    "static_layers": StaticLayers,
    "frequency": Frequency,
    "belady": Belady,
    "layer_sweep": LayerSweep,
    "s3fifo": S3FIFO,
    "lookahead": Lookahead,
    "hinted_sweep": HintedSweep,
    "ktransformers_dynamic": KTransformersDynamic,
    "moe_infinity": MoEInfinity,
}

BUILTIN = dict(POLICIES)  # the shipped classes


def make_policy(name: str, capacity: int, num_layers: int, num_experts: int, *, reference: bool = False,
                **options) -> PlacementPolicy:
    """Build a policy by name. options go to its constructor (profile=, future=, n_cpu_layers=, scope=, ...).

    A class with a compiled half of its own (`compiled`, every built-in) comes back as a CompiledPolicy (same Plans,
    compiled speed); reference=True, or a class without one, gives the interpreted Python class."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; valid: {', '.join(sorted(POLICIES))}") from None
    if options:
        accepted = constructor_options(cls)
        unknown = set(options) - accepted
        if unknown:
            raise ValueError(f"policy {name!r} takes no option {', '.join(sorted(unknown))}; "
                             f"it takes: {', '.join(sorted(accepted)) or 'none'}")
    # a live hint or carry is a Python object; hinted_sweep's running accuracy tally (measure) exists only interpreted
    live = options and (options.get("hint") is not None or isinstance(options.get("carry"), LiveCarry))
    if not reference and is_compiled(name) and not live and not options.get("measure"):
        options.pop("measure", None)  # off: no tally, the compiled decision is the same
        return CompiledPolicy(cls, capacity, num_layers, num_experts, **options)
    return cls(capacity, num_layers, num_experts, **options)


def is_compiled(name: str) -> bool:
    """Whether make_policy(name, ...) decides in compiled code: the class has a compiled half of its own (a subclass
    of a built-in class changes its decision, so it does not inherit its parent's)."""
    return "compiled" in vars(POLICIES[name]) if name in POLICIES else False


__all__ = [
    "BUILTIN", "Belady", "CacheConfig", "Call", "CallStream", "CompiledPolicy", "Counts", "DECODE",
    "DEFAULT_PREFILL_CHUNK", "FETCH_ORDERS", "Frequency", "KeyStream", "LRU", "NOT_RESIDENT", "POLICIES", "PREFILL", "PlacementPolicy", "Plan",
    "Split", "StaticLayers", "balanced_fetch_count", "build_policy", "cache_config", "call_stream", "is_compiled",
    "key_stream", "make_call", "make_policy", "paper_fetch_count",
]
