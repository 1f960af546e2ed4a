"""Compiled placement against the Python reference classes, Plan by Plan, and the stream replay against both.

Every compiled policy x split (offload, cpu, hybrid with each rule, each fetch order, fetch_min_pairs, prefill
streaming through staging) x capacity {0, below the largest call, 10/25/50%, all} on slices of real traces
(Mixtral token level, DeepSeek-V2-Lite's first 20 prompts, Granite prefill + decode) and synthetic ones. The
reference is freetoken.placement.<policy> run interpreted (make_policy(..., reference=True)); the compiled side
runs both ways: plan() per call (the engine's path) and replay_stream (the simulator's, no Python per call).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from freetoken.placement import DECODE, PREFILL, CompiledPolicy, Split, is_compiled, make_policy
from freetoken.placement.policies.sweep.layer_sweep import visit_rates
from freetoken.trace import RoutingTrace
from freetoken.trace.importers import import_trace
from freetoken.trace.stats import expert_counts
from freetoken.sim.calls import trace_stream
from freetoken.sim.replay import replay, replay_stream

SPLITS = {
    "offload": Split("offload"),
    "cpu": Split("cpu"),
    "balanced-most_tokens": Split("hybrid", "balanced", bp=20.0, bh=30.0, fetch_order="most_tokens"),
    "paper-most_recent": Split("hybrid", "paper", bp=25.0, bh=20.0, fetch_order="most_recent"),
    "max2-lowest_id": Split("hybrid", "max_fetch", max_fetch=2, fetch_order="lowest_id"),
    "min_pairs-stream_prefill": Split("hybrid", "max_fetch", max_fetch=1, fetch_order="most_recent",
                                      fetch_min_pairs=12, admit_prefill=False),
}
# a trace's slice: real ones are kept small so the whole file stays fast with the interpreted reference
POLICIES = [("lru", {}), ("static_layers", {}), ("frequency", {"scope": "per_layer"}),
            ("frequency", {"scope": "global"}), ("frequency", {"strategy": "uniform"}),
            ("frequency", {"strategy": "front_loading"}), ("belady", {"bypass": True}), ("belady", {"bypass": False}),
            ("s3fifo", {}), ("s3fifo", {"small": 0.3}),
            ("layer_sweep", {}), ("layer_sweep", {"decay": 0.7, "scan": 3, "bypass": False}),
            ("layer_sweep", {"prior": "visit_rates"}),
            ("lookahead", {"accuracy": 0.7, "depth": 2, "scan": 4}), ("lookahead", {"accuracy": 1.0, "decay": 0.8}),
            ("hinted_sweep", {"accuracy": 0.8, "depth": 2, "min_confidence": 0.4}),
            ("hinted_sweep", {"accuracy": 0.9, "bypass": False, "prior": "visit_rates"}),
            ("ktransformers_dynamic", {"window": 2, "prefill_pairs": 8}),
            ("ktransformers_dynamic", {"strategy": "frequency", "window": 5, "prefill_pairs": 10 ** 9}),
            ("moe_infinity", {}), ("moe_infinity", {"library": 2, "depth": 2, "width": 3}),
            ("lru", {"scope": "per_layer"}), ("lru", {"scope": "per_layer", "split": "profile"})]


def synthetic(seed: int, T: int = 36, L: int = 4, E: int = 8, K: int = 3) -> RoutingTrace:
    """Two requests, each prefill then decode; skewed picks so caches see reuse."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, E + 1) ** 1.2
    p /= p.sum()
    ex = np.empty((T, L, K), np.int16)
    for layer in range(L):
        perm = rng.permutation(E)
        for t in range(T):
            ex[t, layer] = perm[rng.choice(E, K, replace=False, p=p)]
    request = np.repeat(np.array([0, 1], np.int32), [T // 2, T - T // 2])
    phase = np.zeros(T, np.int8)
    phase[T // 4:T // 2] = DECODE
    phase[T // 2 + T // 6:] = DECODE
    return RoutingTrace(ex, E, request=request, phase=phase)


def _with_phases(trace: RoutingTrace, prefill: int) -> RoutingTrace:
    """Each request's first `prefill` tokens as prefill, the rest decode."""
    start = np.r_[0, np.flatnonzero(np.diff(trace.request)) + 1]
    pos = np.arange(trace.num_tokens) - np.repeat(start, np.diff(np.r_[start, trace.num_tokens]))
    return RoutingTrace(trace.experts, trace.num_experts, request=trace.request,
                        phase=np.where(pos < prefill, PREFILL, DECODE).astype(np.int8))


@functools.lru_cache(maxsize=None)
def real(name: str) -> tuple[RoutingTrace, int]:
    """(trace slice, prefill chunk)."""
    from tests.conftest import shared_traces_dir

    root = shared_traces_dir()
    if root is None:
        pytest.skip("real traces not present (set FT_SHARED_TRACES or place shared/ beside the checkout)")
    if name == "mixtral":  # token level: every token its own call
        tr = import_trace(root / "mixtral-8x7b" / "gsm8k_2_routing.jsonl")
        tr = tr.select(np.arange(tr.num_tokens) < 32)
        return RoutingTrace(tr.experts, tr.num_experts, request=tr.request,
                            phase=np.full(tr.num_tokens, DECODE, np.int8)), 1
    if name == "deepseek":  # the first 20 prompts, their first 8 tokens: 5 prefill in chunks of 3, 3 decode
        tr = import_trace(root / "deepseek-v2-lite" / "deepseek_v2_lite_prefill_top6.npz")
        tr = tr.select(tr.request < 20)
        start = np.r_[0, np.flatnonzero(np.diff(tr.request)) + 1]
        pos = np.arange(tr.num_tokens) - np.repeat(start, np.diff(np.r_[start, tr.num_tokens]))
        return _with_phases(tr.select(pos < 8), 5), 3
    if name == "granite":  # recorded prefill + decode; the first 6 prefill and 6 decode tokens of each prompt
        tr = import_trace(root / "granite-3.0-1b-a400m" / "moe_expert_trace.json")
        keep = np.zeros(tr.num_tokens, bool)
        for r in np.unique(tr.request):
            for ph in (PREFILL, DECODE):
                idx = np.flatnonzero((tr.request == r) & (tr.phase == ph))
                keep[idx[:6]] = True
        return tr.select(keep), 4
    raise KeyError(name)


def capacities(trace: RoutingTrace, stream) -> list[int]:
    n = trace.num_keys
    largest = int(stream.sizes().max())
    return sorted({0, largest - 1, round(0.1 * n), round(0.25 * n), round(0.5 * n), n})


def build(policy: str, options: dict, capacity: int, trace: RoutingTrace, stream, reference: bool):
    opts = dict(options)
    if policy == "frequency" or opts.get("strategy") == "frequency" or opts.get("split") == "profile":
        opts["profile"] = expert_counts(trace)
    if policy in ("belady", "lookahead", "hinted_sweep"):
        opts["future"] = stream.key_stream()
    if opts.get("prior") == "visit_rates":  # a warm start from the trace's own per-visit use rates
        opts["prior"] = visit_rates(stream.calls(), trace.num_layers, trace.num_experts)
    if policy == "static_layers" and capacity < trace.num_experts:
        opts["n_cpu_layers"] = trace.num_layers  # all layers on the CPU: the only split that fits
    return make_policy(policy, capacity, trace.num_layers, trace.num_experts, reference=reference, **opts)


def check(trace: RoutingTrace, chunk: int, policy: str, options: dict, splits, take_turns: bool = False) -> int:
    """compiled plan() == reference plan() call by call, and the compiled stream's log == the reference's log, for
    every capacity with every split (take_turns: the splits take the capacities in turn, so each capacity meets one
    split and each split a share of the capacities); returns the accesses that hit somewhere (so a test knows it was
    not degenerate)."""
    stream = trace_stream(trace, chunk)
    calls = list(stream.calls())
    hits = 0
    for i, capacity in enumerate(capacities(trace, stream)):
        for split_name in [splits[i % len(splits)]] if take_turns else splits:
            split = SPLITS[split_name]
            ref = replay(calls, build(policy, options, capacity, trace, stream, True), split, keep_plans=True)
            ours = build(policy, options, capacity, trace, stream, False)
            assert isinstance(ours, CompiledPolicy)
            for c, (call, want) in enumerate(zip(calls, ref.plans)):
                got = ours.plan(call, split)
                assert got == want, f"{policy} {options} {split_name} capacity {capacity} call {c}: {call}"
            streamed = replay_stream(stream, build(policy, options, capacity, trace, stream, False), split)
            for column in ref.log.__slots__:
                assert np.array_equal(getattr(streamed.log, column), getattr(ref.log, column)), column
            hits += ref.total.hits
    return hits


@pytest.mark.parametrize("policy, options", POLICIES, ids=lambda x: x if isinstance(x, str) else
                         "-".join(str(v) for v in x.values()) or "-")
def test_synthetic_every_split(policy, options):
    assert check(synthetic(0), 5, policy, options, list(SPLITS)) > 0


@pytest.mark.slow
@pytest.mark.parametrize("policy, options", POLICIES, ids=lambda x: x if isinstance(x, str) else
                         "-".join(str(v) for v in x.values()) or "-")
@pytest.mark.parametrize("name", ["mixtral", "deepseek", "granite"])
def test_real_traces(name, policy, options):
    """Recorded routing: each capacity under one of two splits (the synthetic test above takes every pair)."""
    trace, chunk = real(name)
    splits = {"mixtral": ["offload", "balanced-most_tokens"], "deepseek": ["offload", "paper-most_recent"],
              "granite": ["min_pairs-stream_prefill", "max2-lowest_id"]}[name]
    assert check(trace, chunk, policy, options, splits, take_turns=True) > 0


def test_every_builtin_policy_compiled():
    from freetoken.placement import BUILTIN

    assert all(is_compiled(name) for name in BUILTIN)


# bad input: one line, as the reference
def test_bad_options_and_sizes():
    with pytest.raises(ValueError, match="takes no option"):
        make_policy("lru", 4, 2, 4, depth=3)
    with pytest.raises(ValueError, match="capacity must lie in"):
        make_policy("lru", 9, 2, 4)
    with pytest.raises(ValueError, match="capacity must lie in"):
        make_policy("belady", -1, 2, 4, future=None)
    with pytest.raises(ValueError, match="needs the future"):
        make_policy("belady", 2, 2, 4)
    with pytest.raises(ValueError, match="profile must have shape"):
        make_policy("frequency", 2, 2, 4, profile=np.zeros((3, 4)))
    with pytest.raises(ValueError, match="n_cpu_layers"):
        make_policy("static_layers", 4, 2, 4, n_cpu_layers=0)


def test_ids_out_of_range():
    from freetoken.placement import Call, KeyStream

    pol = make_policy("lru", 2, 2, 4)
    with pytest.raises(ValueError, match="out of range"):
        pol.plan(Call(0, [1, 4], [1, 1]), Split())
    with pytest.raises(ValueError, match="out of range"):
        pol.plan(Call(2, [1], [1]), Split())
    with pytest.raises(ValueError, match="must lie in"):
        make_policy("belady", 2, 2, 4, future=KeyStream(np.array([0, 8]), np.array([0, 1, 2])))
    pol = make_policy("belady", 2, 2, 4, future=KeyStream(np.array([0, 1]), np.array([0, 1, 2])))
    pol.plan(Call(0, [0], [1]), Split())
    with pytest.raises(ValueError, match="differ from the future"):
        pol.plan(Call(0, [2], [1]), Split())
