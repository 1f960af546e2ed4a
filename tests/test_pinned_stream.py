"""The pinned policies' own stream replay (compiled/pinned_stream.py: static_layers and frequency under offload)
against the generic compiled driver and the Python reference: the same log and the same state (slots, marks,
clocks, call count), so a replay can be split into chunks and continued by plan() calls; any other split takes the
driver. Every capacity of test_compiled_policies.capacities on synthetic traces (and real slices, slow)."""

from __future__ import annotations

import numpy as np
import pytest

from freetoken.sim.calls import trace_stream
from freetoken.sim.replay import replay, replay_stream
from tests.test_compiled_policies import SPLITS, build, capacities, real, synthetic

PINNED = ("static_layers", "frequency")


def _check(trace, chunk: int) -> int:
    stream = trace_stream(trace, chunk)
    calls = list(stream.calls())
    C = stream.num_calls
    hits = 0
    for policy in PINNED:
        for capacity in capacities(trace, stream):
            fast, generic = (build(policy, {}, capacity, trace, stream, False) for _ in range(2))
            assert fast.own_stream
            half = C // 2  # the first half streamed in two chunks, the rest by plan(): the state carries over
            log_fast, log_generic = np.full((8, C), -7, np.int64), np.full((8, C), -7, np.int64)
            for c0, c1 in ((0, half // 2), (half // 2, half)):
                assert fast.replay(stream, SPLITS["offload"], c0, c1, log_fast) is not None
                generic.replay(stream, SPLITS["offload"], c0, c1, log_generic, generic=True)
            assert np.array_equal(log_fast[:, :half], log_generic[:, :half]), (policy, capacity)
            for a, b in zip(list(fast.core) + list(fast.state), list(generic.core) + list(generic.state)):
                assert np.array_equal(a, b), (policy, capacity, "state differs")
            for call in calls[half:]:
                assert fast.plan(call, SPLITS["offload"]) == generic.plan(call, SPLITS["offload"])
            for name, split in SPLITS.items():  # the stream replay (offload) or the driver (the others)
                ref = replay(calls, build(policy, {}, capacity, trace, stream, True), split)
                ours = replay_stream(stream, build(policy, {}, capacity, trace, stream, False), split)
                for column in ref.log.__slots__:
                    assert np.array_equal(getattr(ours.log, column), getattr(ref.log, column)), (policy, name, column)
                assert ours.total == ref.total, (policy, name, capacity)
                hits += ref.total.hits
    return hits


def test_synthetic():
    for seed in (0, 1):
        assert _check(synthetic(seed, T=48), 5) > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mixtral", "deepseek", "granite"])
def test_real_traces(name):
    trace, chunk = real(name)
    assert _check(trace, chunk) > 0
