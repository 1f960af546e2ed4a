"""One-pass LRU miss-ratio curve against per-capacity replays, a brute-force stack depth, and libCacheSim."""

from __future__ import annotations

import numpy as np
import pytest

from freetoken.sim.libcachesim import libcachesim_misses
from freetoken.placement import DECODE, LRU, PREFILL, KeyStream, Split, key_stream, make_policy
from freetoken.trace import RoutingTrace
from freetoken.trace.importers import import_trace
from freetoken.sim.calls import trace_calls, trace_stream
from freetoken.sim.mrc import COLD, lru_mrc, stack_depths
from freetoken.sim.replay import replay, replay_stream


def mixed_trace(seed: int, T: int = 90, L: int = 3, E: int = 8, K: int = 2) -> RoutingTrace:
    """Three requests, each prefill then decode; skewed picks so reuse happens at every capacity."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, E + 1) ** 1.2
    p /= p.sum()
    ex = np.empty((T, L, K), np.int16)
    for layer in range(L):  # K distinct picks per token: top-K of Gumbel-perturbed log-probabilities
        ex[:, layer] = rng.permutation(E)[np.argsort(-(np.log(p) + rng.gumbel(size=(T, E))), axis=1)[:, :K]]
    request = np.repeat(np.arange(3, dtype=np.int32), T // 3)
    phase = np.tile(np.repeat(np.array([PREFILL, DECODE], np.int8), [T // 9, T // 3 - T // 9]), 3)
    return RoutingTrace(ex, E, request=request, phase=phase)


def replay_misses(calls, trace, capacity):
    return replay(calls, LRU(capacity, trace.num_layers, trace.num_experts), Split("offload")).total.misses


def brute_depths(stream: KeyStream) -> list[int]:
    """Distinct keys accessed after the key's previous access and before its call starts, by definition."""
    keys, off = stream.keys.tolist(), stream.offsets.tolist()
    out = []
    for c in range(len(off) - 1):
        for i in range(off[c], off[c + 1]):
            before = [j for j in range(i) if keys[j] == keys[i]]
            out.append(COLD if not before else len(set(keys[before[-1] + 1:off[c]])))
    return out


def test_depths_match_definition():
    rng = np.random.default_rng(0)
    for _ in range(150):
        n_keys = int(rng.integers(2, 12))
        sizes = [min(int(a), n_keys) for a in rng.integers(1, 5, int(rng.integers(1, 25)))]
        keys = np.concatenate([rng.choice(n_keys, a, replace=False) for a in sizes]).astype(np.int64)
        stream = KeyStream(keys, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
        assert stack_depths(stream).tolist() == brute_depths(stream)


@pytest.mark.parametrize("seed, chunk", [(0, 4), (1, 7), (2, 2048)])
def test_mrc_equals_replay_at_every_capacity(seed, chunk):
    trace = mixed_trace(seed)
    calls = list(trace_calls(trace, prefill_chunk=chunk))
    curve = lru_mrc(key_stream(calls, trace.num_experts))
    assert curve.min_exact_capacity == max(len(c.experts) for c in calls)
    assert curve.accesses == sum(len(c.experts) for c in calls)
    assert curve.misses_at(0) == curve.accesses == replay_misses(calls, trace, 0)
    for capacity in range(curve.min_exact_capacity, trace.num_keys + 1):
        assert curve.misses_at(capacity) == replay_misses(calls, trace, capacity), capacity
    assert curve.misses_at(trace.num_keys) == curve.cold_misses == len(set(key_stream(calls, trace.num_experts).keys.tolist()))


def test_mrc_on_a_real_trace_sample(shared_traces):
    full = import_trace(shared_traces / "deepseek-v2-lite" / "deepseek_v2_lite_prefill_top6.npz")
    trace = full.select(full.request < 20)
    calls = list(trace_calls(trace, prefill_chunk=32))  # all prefill: chunks of 32 tokens, calls of 1 to ~40 keys
    curve = lru_mrc(key_stream(calls, trace.num_experts))
    for capacity in np.linspace(curve.min_exact_capacity, trace.num_keys, 7).astype(int).tolist():
        assert curve.misses_at(capacity) == replay_misses(calls, trace, capacity), capacity
    ratios = curve.miss_ratios
    assert ratios[curve.min_exact_capacity] > 0.5 > ratios[-1]  # the curve spans the interesting range


@pytest.mark.parametrize("name, tokens", [("mixtral-8x7b/humaneval_2_routing.jsonl", 333),  # decode, top-2
                                          ("deepseek-v2-lite/deepseek_v2_lite_prefill_top6.npz", 3000)])
def test_mrc_equals_compiled_replays_on_real_traces(shared_traces, name, tokens):
    """The curve (compiled one pass) against the compiled LRU replay (the production path) on real slices."""
    full = import_trace(shared_traces / name)
    trace = full.select(np.arange(full.num_tokens) < tokens)
    stream = trace_stream(trace, 16)
    curve = lru_mrc(stream.key_stream())
    grid = np.unique(np.linspace(curve.min_exact_capacity, trace.num_keys, 9).astype(int)).tolist()
    for capacity in [0] + grid:
        policy = make_policy("lru", capacity, trace.num_layers, trace.num_experts)
        assert curve.misses_at(capacity) == replay_stream(stream, policy, Split("offload")).total.misses, capacity


@pytest.mark.parametrize("top_k", [1, 3])
def test_sequential_depths_equal_libcachesim(top_k):
    """The same counting, one key per call, is libCacheSim's sequential LRU at every capacity."""
    trace = mixed_trace(5, T=120, K=top_k)
    keys = key_stream(trace_calls(trace, 4), trace.num_experts).keys
    curve = lru_mrc(KeyStream(keys, np.arange(keys.size + 1)))
    assert curve.min_exact_capacity == 1
    for capacity in range(1, trace.num_keys + 1):
        assert curve.misses_at(capacity) == libcachesim_misses(keys, capacity, "LRU"), capacity


def test_top1_decode_mrc_equals_libcachesim():
    trace = mixed_trace(6, T=150, K=1)
    trace = RoutingTrace(trace.experts, trace.num_experts, phase=np.full(trace.num_tokens, DECODE, np.int8))
    stream = key_stream(trace_calls(trace), trace.num_experts)
    curve = lru_mrc(stream)
    for capacity in (1, 3, 8, 16, 24):
        assert curve.misses_at(capacity) == libcachesim_misses(stream.keys, capacity, "LRU")


def test_curve_csv(tmp_path):
    stream = KeyStream(np.array([0, 1, 2, 0, 1, 3], np.int64), np.array([0, 3, 5, 6], np.int64))
    rows = lru_mrc(stream).write_csv(tmp_path / "out" / "mrc.csv").read_text().splitlines()
    # 4 distinct keys -> capacities 0..4; 0 and 1 come back at depths 2 and 1 (the stack model's figure at 1
    # and 2 slots, below the 3-key call, is marked inexact)
    assert rows == ["capacity,misses,miss_ratio,exact", "0,6,1,1", "1,6,1,0", "2,5,0.833333,0", "3,4,0.666667,1",
                    "4,4,0.666667,1"]


def test_inexact_capacity_and_bad_streams_are_refused():
    stream = KeyStream(np.array([0, 1, 2, 0, 1], np.int64), np.array([0, 3, 5], np.int64))
    curve = lru_mrc(stream)
    assert curve.min_exact_capacity == 3 and curve.misses_at(3) == 3  # 0 and 1 come back: hits
    with pytest.raises(ValueError, match="largest call"):
        curve.misses_at(2)
    with pytest.raises(ValueError, match="twice in one call"):
        lru_mrc(KeyStream(np.array([4, 4], np.int64), np.array([0, 2], np.int64)))
    for offsets in ([0, 3], [0, 1], [1, 2], [0, 2, 1, 2]):  # the compiled pass trusts them: checked first
        with pytest.raises(ValueError, match="offsets"):
            lru_mrc(KeyStream(np.array([4, 5], np.int64), np.array(offsets, np.int64)))
    with pytest.raises(ValueError, match="keys must be >= 0"):
        lru_mrc(KeyStream(np.array([-1], np.int64), np.array([0, 1], np.int64)))
    empty = lru_mrc(KeyStream(np.zeros(0, np.int64), np.zeros(1, np.int64)))
    assert empty.accesses == 0 and empty.misses_at(5) == 0
