"""One simulation run from names: trace + policy + split + capacity -> ReplayResult."""

from __future__ import annotations

from dataclasses import dataclass, field

from freetoken.placement import POLICIES, Split, make_policy
from freetoken.trace import RoutingTrace
from freetoken.trace.stats import expert_counts
from sim.calls import DEFAULT_PREFILL_CHUNK, trace_stream
from sim.replay import ReplayResult, replay_stream


@dataclass(frozen=True, slots=True)
class SimConfig:
    policy: str = "lru"
    split: Split = field(default_factory=Split)
    capacity: int | None = None
    fraction: float | None = None  # of all (layer, expert) keys, when capacity is not given
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    expert_bytes: int = 0
    options: dict = field(default_factory=dict)  # policy constructor options

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy: unknown {self.policy!r}; valid: {', '.join(sorted(POLICIES))}")
        if (self.capacity is None) == (self.fraction is None):
            raise ValueError("give exactly one of capacity (expert slots) or fraction (of all experts)")
        if self.capacity is not None and self.capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {self.capacity}")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"fraction must lie in (0, 1], got {self.fraction}")
        if self.prefill_chunk <= 0:
            raise ValueError(f"prefill_chunk must be positive, got {self.prefill_chunk}")
        if self.expert_bytes < 0:
            raise ValueError(f"expert_bytes must be >= 0, got {self.expert_bytes}")

    def slots_for(self, trace: RoutingTrace) -> int:
        if self.capacity is not None:
            if self.capacity > trace.num_keys:
                raise ValueError(f"capacity {self.capacity} exceeds the trace's {trace.num_keys} experts "
                                 f"({trace.num_layers} layers x {trace.num_experts})")
            return self.capacity
        return int(round(self.fraction * trace.num_keys))


def simulate(trace: RoutingTrace, config: SimConfig, profile: RoutingTrace | None = None,
             keep_plans: bool = False, on_call=None) -> ReplayResult:
    """profile: trace whose counts pin experts for `frequency`, strategy=frequency (ktransformers_dynamic)
    and split=profile (lru) (default: the replayed trace itself, in-sample)."""
    capacity = config.slots_for(trace)
    options = dict(config.options)
    cls = POLICIES[config.policy]
    if "profile" not in options and (config.policy == "frequency" or options.get("strategy") == "frequency"
                                     or options.get("split") == "profile"):
        options["profile"] = expert_counts(profile if profile is not None else trace)
    if config.policy == "moe_infinity" and profile is not None and "past" not in options:
        from freetoken.placement.moe_infinity import activation_matrices

        options["past"] = activation_matrices(profile)  # the offline library (no in-sample default: a leak)
    stream = trace_stream(trace, config.prefill_chunk)  # built once: the replay's calls and belady's future
    if cls.needs_future and "future" not in options:
        options["future"] = stream.key_stream()
    policy = make_policy(config.policy, capacity, trace.num_layers, trace.num_experts, **options)
    return replay_stream(stream, policy, config.split, expert_bytes=config.expert_bytes, keep_plans=keep_plans,
                         on_call=on_call)
