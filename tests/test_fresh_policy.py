"""Nothing leaks between compiled policies of one size: a policy built after a used one starts cold, policies used in
turn or from two threads each give their own reference's log. Checked against the Python reference, column by
column or Plan by Plan."""

from __future__ import annotations

import pickle
import sys
import threading

import numpy as np
import pytest

from freetoken.placement import Split, make_policy
from freetoken.sim.calls import trace_stream
from freetoken.sim.replay import COLUMNS, replay, replay_stream
from tests.test_compiled_policies import synthetic

SPLIT = Split("hybrid", "balanced", bp=20.0, bh=30.0, fetch_order="most_tokens")  # fetches some misses, not all


def _arrays(policy) -> list[np.ndarray]:
    """Every array of a compiled policy's state (its State's nested NamedTuples included) and core."""
    def flat(t):
        return [a for x in t for a in (flat(x) if isinstance(x, tuple) else [x]) if isinstance(a, np.ndarray)]
    return flat(policy.core) + flat(policy.state)


def _columns(log) -> dict:
    return {c: getattr(log, c).tolist() for c in COLUMNS}


@pytest.mark.parametrize("name", ["lru", "s3fifo", "ktransformers_dynamic"])
def test_a_policy_built_after_a_used_one_starts_cold(name):
    trace = synthetic(3, T=40)
    stream = trace_stream(trace, 5)
    L, E, capacity = trace.num_layers, trace.num_experts, 9
    want = _columns(replay(stream.calls(), make_policy(name, capacity, L, E, reference=True), SPLIT).log)
    used = make_policy(name, capacity, L, E)
    assert _columns(replay_stream(stream, used, SPLIT).log) == want
    fresh = make_policy(name, capacity, L, E)
    cold = dict(make_policy(name, capacity, L, E, reference=True).slot_of)  # empty, or a warm start's pinned set
    assert used.calls_planned == stream.num_calls and fresh.calls_planned == fresh.clock == 0 and fresh.slot_of == cold
    assert not any(np.shares_memory(a, b) for a, b in zip(_arrays(fresh), _arrays(used)))
    assert _columns(replay_stream(stream, fresh, SPLIT).log) == want


def test_policies_of_one_size_planning_in_turn_give_the_reference_plans():
    trace = synthetic(5, T=40)
    calls = list(trace_stream(trace, 5).calls())
    L, E = trace.num_layers, trace.num_experts
    forward, backward = make_policy("lru", 9, L, E), make_policy("lru", 9, L, E)
    ref_forward, ref_backward = (make_policy("lru", 9, L, E, reference=True) for _ in range(2))
    for a, b in zip(calls, reversed(calls)):
        assert forward.plan(a, SPLIT) == ref_forward.plan(a, SPLIT)
        assert backward.plan(b, SPLIT) == ref_backward.plan(b, SPLIT)


@pytest.mark.parametrize("builder_drives", [False, True])
def test_policies_of_one_size_planning_in_two_threads_give_their_logs_alone(builder_drives):
    """Two same-size policies built in one thread, driven call by call at once from two threads (the building one
    among them, or two others): each log is that policy's replayed alone."""
    streams = [trace_stream(synthetic(seed, T=600), 5) for seed in (11, 12)]
    L, E = 4, 8
    alone = [_columns(replay(s.calls(), make_policy("lru", 9, L, E), SPLIT).log) for s in streams]
    assert alone[0] != alone[1]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over between almost any two bytecodes: the threads interleave
    try:
        for _ in range(3):
            policies = [make_policy("lru", 9, L, E) for _ in streams]  # built here, in one thread
            start, got = threading.Barrier(2), [None, None]

            def drive(i):
                start.wait()
                got[i] = _columns(replay(streams[i].calls(), policies[i], SPLIT).log)

            threads = [threading.Thread(target=drive, args=(i,)) for i in ((1,) if builder_drives else (0, 1))]
            for t in threads:
                t.start()
            if builder_drives:
                drive(0)
            for t in threads:
                t.join()
            assert got == alone
    finally:
        sys.setswitchinterval(switch)


def test_stream_log_columns_are_the_references():
    trace = synthetic(7, T=40)
    stream = trace_stream(trace, 5)
    L, E = trace.num_layers, trace.num_experts
    log = replay_stream(stream, make_policy("lru", 9, L, E), SPLIT).log
    ref = replay(stream.calls(), make_policy("lru", 9, L, E, reference=True), SPLIT).log
    assert _columns(log) == _columns(ref) and sum(ref.fetched) > 0 and sum(ref.cpu) > 0
    assert _columns(pickle.loads(pickle.dumps(log))) == _columns(ref)
