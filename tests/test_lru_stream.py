"""LRU's own stream replay (compiled/lru_stream.py) against the generic compiled driver and the Python reference.

The fast path must leave the same log and the same state as the generic driver (slots, recency list, per-layer
counts, clocks), so a replay can be split into chunks and continued by plan() calls; tested over every split in
test_compiled_policies.SPLITS x capacities {0, below the largest call, 10/25/50%, all} on synthetic and real slices.
"""

from __future__ import annotations

import numpy as np
import pytest

from freetoken.placement import make_policy
from freetoken.sim.calls import trace_stream
from freetoken.sim.replay import replay, replay_stream
from tests.test_compiled_policies import SPLITS, capacities, real, synthetic

def _state(policy) -> list[np.ndarray]:
    return list(policy.core) + list(policy.state)


def _check(trace, chunk: int, splits) -> int:
    stream = trace_stream(trace, chunk)
    calls = list(stream.calls())
    C, L, E = stream.num_calls, trace.num_layers, trace.num_experts
    hits = 0
    for capacity in capacities(trace, stream):
        for name in splits:
            split = SPLITS[name]
            fast, generic = make_policy("lru", capacity, L, E), make_policy("lru", capacity, L, E)
            assert fast.own_stream
            half = C // 2  # the first half streamed in two chunks, the rest by plan(): the state carries over
            log_fast, log_generic = np.full((8, C), -7, np.int64), np.full((8, C), -7, np.int64)
            for c0, c1 in ((0, half // 2), (half // 2, half)):
                fast.replay(stream, split, c0, c1, log_fast)
                generic.replay(stream, split, c0, c1, log_generic, generic=True)
            assert np.array_equal(log_fast[:, :half], log_generic[:, :half]), f"{name} capacity {capacity}"
            for a, b in zip(_state(fast), _state(generic)):
                assert np.array_equal(a, b), f"{name} capacity {capacity}: state differs"
            for call in calls[half:]:
                assert fast.plan(call, split) == generic.plan(call, split)
            ref = replay(calls, make_policy("lru", capacity, L, E, reference=True), split)
            ours = replay_stream(stream, make_policy("lru", capacity, L, E), split)
            for column in ref.log.__slots__:
                assert np.array_equal(getattr(ours.log, column), getattr(ref.log, column)), (name, capacity, column)
            hits += ref.total.hits
    return hits


def test_synthetic_every_split():
    for seed in (0, 1):
        assert _check(synthetic(seed, T=48), 5, list(SPLITS)) > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mixtral", "deepseek", "granite"])
def test_real_traces(name):
    trace, chunk = real(name)
    assert _check(trace, chunk, list(SPLITS)) > 0


def test_per_layer_scope_keeps_the_generic_driver():
    assert make_policy("lru", 4, 2, 4).own_stream and not make_policy("lru", 4, 2, 4, scope="per_layer").own_stream


def test_verify_calls_count_their_tokens():
    """A speculative verify call is a decode call of d + 1 tokens: its keys' counts exceed 1, and the stream
    replay must read them (the generic driver's token columns), not take a decode call as one token."""
    from freetoken.sim.batch import Speculation
    from freetoken.sim.calls import steps_stream
    from freetoken.sim.speculative import speculative_steps

    trace = synthetic(0, T=48)
    stream = steps_stream(trace, speculative_steps(trace, Speculation(3, 0.7), 5, seed=1))
    decode = np.repeat(stream.phase == 1, np.diff(stream.offsets))
    assert stream.tokens[decode].max() > 1  # the case under test is present
    C, L, E = stream.num_calls, trace.num_layers, trace.num_experts
    for split in ("offload", "balanced-most_tokens"):
        for capacity in capacities(trace, stream):
            fast, generic = make_policy("lru", capacity, L, E), make_policy("lru", capacity, L, E)
            log_fast, log_generic = np.full((8, C), -7, np.int64), np.full((8, C), -7, np.int64)
            fast.replay(stream, SPLITS[split], 0, C, log_fast)
            generic.replay(stream, SPLITS[split], 0, C, log_generic, generic=True)
            assert np.array_equal(log_fast, log_generic), (split, capacity)
            assert log_fast[5:8].sum() == stream.tokens.sum()  # every (token, expert) pair in one lane
