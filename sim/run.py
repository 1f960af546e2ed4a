"""One simulation run from names: trace + cache config (policy, split, size, prefill chunk) -> ReplayResult."""

from __future__ import annotations

from dataclasses import dataclass, replace

from freetoken.placement import POLICIES, CacheConfig, KeyStream, Split, build_policy
from freetoken.placement.carry import DRAFTS
from freetoken.placement.config import ConfigError
from freetoken.trace import RoutingTrace, load
from freetoken.sim.calls import steps_stream, trace_key_stream, trace_stream
from freetoken.sim.carry import carry_stream
from freetoken.sim.replay import ReplayResult, replay_stream


@dataclass(frozen=True, slots=True)
class SimConfig(CacheConfig):
    """The one cache config (freetoken.placement.CacheConfig) plus what only a replay reports: bytes per expert,
    for fetched_bytes (the engine counts its store's own)."""

    expert_bytes: int = 0
    batch: int = 1  # > 1: requests interleaved as the server's continuous batching runs them (sim/continuous.py)
    draft_depth: int = 0  # > 0: speculative decoding, each decode step one verify call of d + 1 tokens
    acceptance: float = 1.0  # a: the chance a drafted token is the true next one (sim/speculative.py)
    draft_seed: int = 0  # seeds the drafts' acceptance draws
    prefill_split: Split | None = None  # the split prefill calls use (an engine setting, sim.engines); None: split's

    def __post_init__(self) -> None:
        CacheConfig.__post_init__(self)
        if self.prefill_split is not None and not isinstance(self.prefill_split, Split):
            raise ConfigError("{prefill_split} must be a Split or None, got {v!r}", v=self.prefill_split)
        if not (isinstance(self.draft_depth, int) and self.draft_depth >= 0):
            raise ConfigError("{draft_depth} must be >= 0, got {v}", v=self.draft_depth)
        if isinstance(self.acceptance, bool) or not isinstance(self.acceptance, (int, float)) \
                or not 0 <= self.acceptance <= 1:
            raise ConfigError("{acceptance} must lie in [0, 1], got {v}", v=self.acceptance)
        if not (isinstance(self.expert_bytes, int) and self.expert_bytes >= 0):
            raise ConfigError("{expert_bytes} must be >= 0, got {v}", v=self.expert_bytes)
        if not (isinstance(self.batch, int) and self.batch >= 1):
            raise ConfigError("{batch} must be >= 1, got {v}", v=self.batch)
        carry = self.options.get("carry")
        if isinstance(carry, str) or (carry is not None and not isinstance(carry, KeyStream)):
            if carry != DRAFTS:
                raise ConfigError("{options}: carry must be {d!r} (the rejected drafts of the step before), got {v!r}",
                                  d=DRAFTS, v=carry)
            if not self.draft_depth:
                raise ConfigError("{options}: carry={d} carries the rejected drafts across the step boundary; it needs "
                                  "{draft_depth} > 0", d=DRAFTS)

    def steps(self, trace: RoutingTrace):
        """The row groups a batched (batch > 1) or speculative (draft_depth > 0) replay runs as calls; None: neither
        (the plain chunked calls). Batched: in the order continuous batching plans them (with draft_depth > 0: each
        step every sequence's verify rows, in one call per layer)."""
        if self.batch <= 1 and not self.draft_depth:
            return None  # (the plain calls: nothing below is imported, ~10 ms of `ft sim`'s start)
        from freetoken.sim.batch import Speculation
        from freetoken.sim.continuous import batched_steps
        from freetoken.sim.speculative import speculative_steps

        spec = Speculation(self.draft_depth, float(self.acceptance)) if self.draft_depth else None
        if self.batch > 1:
            return batched_steps(trace, self.batch, self.prefill_chunk, spec, self.draft_seed)
        return speculative_steps(trace, spec, self.prefill_chunk, self.draft_seed) if spec else None

    def speculative_stream(self, trace: RoutingTrace):
        """draft_depth > 0: (the verify calls' CallStream, the Steps it ran)."""
        steps = self.steps(trace)
        return steps_stream(trace, steps), steps


def future_stream(config: CacheConfig, replayed: RoutingTrace | None = None, replayed_stream=None):
    """The future a needs_future policy reads: its `future` trace file, else the replayed trace (in the simulator),
    as the key stream of the calls at the config's prefill chunk (replayed_stream: the replayed trace's call stream,
    when already built). None when the policy reads none."""
    if not POLICIES[config.policy].needs_future or "future" in config.options or "hint" in config.options:
        return None
    if config.future is not None:
        return trace_key_stream(load(config.future), config.prefill_chunk)
    if replayed_stream is not None:
        return replayed_stream.key_stream()
    return None if replayed is None else trace_key_stream(replayed, config.prefill_chunk)


def call_stream(trace: RoutingTrace, config: CacheConfig):
    """(the MoE calls a replay of `trace` under `config` runs, the Steps they were built from or None): continuous
    batching (batch > 1), speculative decoding's verify calls (draft_depth > 0), else the plain chunked calls (None).
    The Steps go on to simulate / replay_setup with the stream: carry=drafts reads them, and drawing them again
    would double the scenario's draw."""
    steps = config.steps(trace) if isinstance(config, SimConfig) else None
    return (trace_stream(trace, config.prefill_chunk) if steps is None else steps_stream(trace, steps)), steps


def simulate(trace: RoutingTrace, config: CacheConfig, profile: RoutingTrace | None = None,
             keep_plans: bool = False, on_call=None, stream=None, double_buffer: bool = False,
             steps=None) -> ReplayResult:
    """profile: trace whose counts a policy reads (frequency's pins, ktransformers_dynamic's strategy=frequency
    start, lru's split=profile quotas; default: the config's profile file, else the replayed trace itself,
    in-sample) and whose requests are moe_infinity's library (no in-sample default there: it would leak the
    evaluated requests' own matrices); the future of offline policies likewise defaults to the replayed trace, whose
    call stream is built once for both (batch > 1: the calls as continuous batching interleaves them; draft_depth > 0:
    the verify calls of speculative decoding). stream: that call stream when the caller already built it
    (call_stream(trace, config)), e.g. for a sweep or to count the calls first; steps: the Steps call_stream drew
    with it (carry=drafts reads them; None: drawn here). double_buffer: also record what a prefill double buffer
    streams into each call (result.streamed; the cost model's engines that have one)."""
    expert_bytes = getattr(config, "expert_bytes", 0)
    config, stream, policy = replay_setup(trace, config, profile, stream, steps)
    return replay_stream(stream, policy, config.split, expert_bytes=expert_bytes, keep_plans=keep_plans,
                         on_call=on_call, prefill_split=getattr(config, "prefill_split", None),
                         double_buffer=double_buffer)


def replay_setup(trace: RoutingTrace, config: CacheConfig, profile: RoutingTrace | None = None, stream=None,
                 steps=None):
    """(config, stream, policy) of a replay of `trace` (see simulate): the hint option resolved, the call stream
    (built unless given, with steps: the Steps it was built from, drawn unless given) and a fresh policy with its
    profile / future / library inputs."""
    library, profile = profile, profile if profile is not None else trace
    if isinstance(config.options.get("hint"), str):  # hint=recorded / measured: built from the replayed trace
        config = _with_replayed_hint(config, trace)
    if config.options.get("carry") == DRAFTS:  # the rejected drafts of each verify step, carried into the next
        steps = config.steps(trace) if steps is None else steps
        config = replace(config, options={**config.options, "carry": carry_stream(trace, steps)})
        stream = steps_stream(trace, steps) if stream is None else stream
    if stream is None:
        stream = call_stream(trace, config)[0]
    future = future_stream(config, trace, stream)
    policy = build_policy(config, trace.num_layers, trace.num_experts, profile=profile, future=future,
                          library=library)
    return config, stream, policy


def _with_replayed_hint(config: CacheConfig, trace: RoutingTrace) -> CacheConfig:
    """config with options hint=recorded / measured replaced by that hint object of `trace` (router_hint.replay_hint):
    the calls of the run that recorded it, so one sequence at a time (no batch, no simulated drafts)."""
    from freetoken.placement.router_hint import replay_hint

    if getattr(config, "batch", 1) > 1 or getattr(config, "draft_depth", 0):
        raise ConfigError("{options}: hint={kind} replays the recorded run's own calls; it takes neither {batch} > 1 "
                          "nor {draft_depth} > 0", kind=config.options["hint"])
    try:
        hint = replay_hint(config.options["hint"], trace, config.prefill_chunk, getattr(config, "draft_seed", 0))
    except ValueError as e:
        raise ConfigError(str(e).replace("{", "{{").replace("}", "}}")) from None
    return replace(config, options={**config.options, "hint": hint})
