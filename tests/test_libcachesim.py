"""Our LRU and Belady miss counts against libCacheSim 0.3.5 (C, through its Python bindings) on the same key stream.

libCacheSim is a sequential cache: one object per request. Projected to top-1 with every token its own call,
our set-access model is the same model, so the counts must be equal. With top-k > 1 the models differ exactly
where a call's keys would push each other out: the set model hits an access at capacity C iff its stack depth at
the call's start is < C, the sequential model iff its depth at the access itself is < C. The second is larger by
the call's keys accessed before it that are new to the window, so the set model never misses more, and they
agree at C iff no access falls in between; that relation is checked exactly below.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from freetoken.sim.libcachesim import libcachesim_misses, libcachesim_misses_per_request
from freetoken.placement import LRU, Belady, KeyStream, Split, key_stream, make_policy
from freetoken.trace import DECODE, RoutingTrace
from freetoken.trace.importers import import_trace
from freetoken.sim.calls import trace_calls, trace_stream
from freetoken.sim.mrc import stack_depths
from freetoken.sim.replay import replay, replay_stream

OFFLOAD = Split("offload")


def as_decode(trace: RoutingTrace, top_k: int | None = None) -> RoutingTrace:
    """Every token its own call (decode), optionally projected to the router's first top_k picks."""
    ex = trace.experts if top_k is None else np.ascontiguousarray(trace.experts[:, :, :top_k])
    return RoutingTrace(ex, trace.num_experts, model=trace.model, source=trace.source, request=trace.request,
                        phase=np.full(trace.num_tokens, DECODE, np.int8))


@functools.lru_cache(maxsize=None)
def synthetic(seed: int = 0, T: int = 1500, L: int = 4, E: int = 16, K: int = 1) -> RoutingTrace:
    """Zipf-skewed picks with a per-layer popularity order, so every capacity sees hits and misses."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, E + 1) ** 1.1
    p /= p.sum()
    ex = np.empty((T, L, K), np.int16)
    perms = [rng.permutation(E) for _ in range(L)]
    for layer in range(L):  # K distinct picks per token: the top-K of Gumbel-perturbed log-probabilities
        scores = np.log(p)[None, :] + rng.gumbel(size=(T, E))
        ex[:, layer] = perms[layer][np.argsort(-scores, axis=1)[:, :K]]
    return RoutingTrace(ex, E, phase=np.full(T, DECODE, np.int8))


_CALLS: dict[int, tuple[RoutingTrace, list]] = {}


def calls_of(trace: RoutingTrace) -> list:
    if id(trace) not in _CALLS:
        _CALLS[id(trace)] = (trace, list(trace_calls(trace)))  # the trace rides along so its id stays unique
    return _CALLS[id(trace)][1]


def ours(trace: RoutingTrace, capacity: int, policy: str = "lru", bypass: bool = False) -> int:
    """Misses of the reference class; the compiled policy's stream replay must count the same."""
    calls = calls_of(trace)
    L, E = trace.num_layers, trace.num_experts
    options = {} if policy == "lru" else {"future": key_stream(calls, E), "bypass": bypass}
    if policy == "lru":
        pol = LRU(capacity, L, E)
    else:
        pol = Belady(capacity, L, E, **options)
    misses = replay(calls, pol, OFFLOAD).total.misses
    compiled = replay_stream(trace_stream(trace), make_policy(policy, capacity, L, E, **options), OFFLOAD)
    assert compiled.total.misses == misses
    return misses


def keys_of(trace: RoutingTrace) -> KeyStream:
    return key_stream(calls_of(trace), trace.num_experts)


@pytest.fixture(scope="module")
def mixtral(shared_traces):
    return import_trace(shared_traces / "mixtral-8x7b" / "gsm8k_2_routing.jsonl")  # 244 tokens x 32 layers, top-2


@pytest.fixture(scope="module")
def deepseek(shared_traces):
    full = import_trace(shared_traces / "deepseek-v2-lite" / "deepseek_v2_lite_prefill_top6.npz")
    return full.select(full.request < 12)  # 12 prompts, ~1,000 tokens x 26 layers, top-6


@pytest.fixture(scope="module")
def mixtral_top1(mixtral):
    return as_decode(mixtral, top_k=1)


@pytest.fixture(scope="module")
def deepseek_top1(deepseek):
    return as_decode(deepseek, top_k=1)


# top-1: the same model
@pytest.mark.parametrize("capacity", [1, 4, 16, 40, 64])
def test_lru_top1_synthetic(capacity):
    trace = synthetic()
    assert ours(trace, capacity) == libcachesim_misses(keys_of(trace).keys, capacity, "LRU")


@pytest.mark.parametrize("capacity", [1, 8, 32, 64, 128, 200])
def test_lru_top1_mixtral(mixtral_top1, capacity):
    trace = mixtral_top1
    want = libcachesim_misses(keys_of(trace).keys, capacity, "LRU")
    assert ours(trace, capacity) == want
    if capacity >= trace.num_layers:  # below one token's 32 keys every access misses; from there some hit
        assert want < trace.num_tokens * trace.num_layers


@pytest.mark.parametrize("capacity", [13, 26, 200, 600])
def test_lru_top1_deepseek(deepseek_top1, capacity):
    trace = deepseek_top1
    assert ours(trace, capacity) == libcachesim_misses(keys_of(trace).keys, capacity, "LRU")


@pytest.mark.parametrize("capacity", [1, 4, 16, 40])
def test_belady_top1_synthetic(capacity):
    trace = synthetic(seed=1)
    want = libcachesim_misses(keys_of(trace).keys, capacity, "Belady")
    assert ours(trace, capacity, "belady", bypass=False) == want
    assert ours(trace, capacity, "belady", bypass=True) <= want  # bypass can only help (sequential: optimal)


@pytest.mark.parametrize("capacity", [8, 32, 64, 128])
def test_belady_top1_mixtral(mixtral_top1, capacity):
    trace = mixtral_top1
    assert ours(trace, capacity, "belady", bypass=False) == libcachesim_misses(keys_of(trace).keys, capacity, "Belady")


def test_per_request_path_agrees():
    """The benchmark's second libCacheSim path (one Request at a time) counts the same as its C reader."""
    keys = keys_of(synthetic(seed=2)).keys
    for capacity in (3, 20):
        assert libcachesim_misses_per_request(keys, capacity) == libcachesim_misses(keys, capacity, "LRU")


# top-k: where the models differ, and by how much
def gap_accesses(stream: KeyStream, capacity: int) -> int:
    """Accesses that hit in the set model and miss in the sequential one: depth at the call's start < C <= depth
    at the access itself (the same stream cut into one-key calls)."""
    at_call = stack_depths(stream)
    at_access = stack_depths(KeyStream(stream.keys, np.arange(stream.keys.size + 1)))
    warm = at_call >= 0
    return int(np.count_nonzero(warm & (at_call < capacity) & (at_access >= capacity)))


def check_topk(trace: RoutingTrace, capacities) -> dict[int, int]:
    """Exact relation at every capacity (from the largest call up); returns capacity -> accesses in the gap."""
    stream = keys_of(trace)
    largest = int(np.diff(stream.offsets).max())
    gaps = {}
    for capacity in capacities:
        assert capacity >= largest
        seq = libcachesim_misses(stream.keys, capacity, "LRU")
        gaps[capacity] = gap_accesses(stream, capacity)
        assert ours(trace, capacity) == seq - gaps[capacity], capacity
    return gaps


def test_topk_mixtral_decode(mixtral):
    trace = as_decode(mixtral)  # top-2, one call per token and layer
    n = trace.num_tokens * trace.num_layers * 2
    gaps = check_topk(trace, [2, 8, 31, 63, 64, 65, 96, 128, 192, 256])
    # Below 32 slots both models miss every access (a key comes back only after the 31 other layers' 62 keys),
    # so they agree; above, top-2 partners that the sequential cache would split are kept together.
    for capacity in (2, 8, 31):
        assert gaps[capacity] == 0 and ours(trace, capacity) == n
    assert sum(gaps[c] > 0 for c in (63, 64, 96, 128, 192)) >= 3


def test_topk_synthetic_decode():
    trace = synthetic(seed=3, K=3)
    gaps = check_topk(trace, [3, 6, 12, 24, 48, 64])
    assert gaps[64] == 0  # the whole key set fits: only cold misses, in both models
    assert any(gaps[c] > 0 for c in (6, 12, 24, 48))


def test_topk_deepseek_prefill(deepseek):
    trace = deepseek  # prefill chunks: one call per prompt and layer, up to 64 keys
    gaps = check_topk(trace, [64, 600, 1000, 1300, 1664])
    # A prompt touches ~1,170 keys, so below ~1,000 slots both models miss every access; all 26 x 64 keys fit
    # at 1,664: cold misses only. In between, the set model keeps a prompt's layer call together.
    assert gaps[64] == gaps[600] == gaps[1664] == 0
    assert gaps[1000] > 0 and gaps[1300] > 0
