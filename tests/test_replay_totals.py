"""replay_stream's totals: LRU's stream replay sums them while it runs (ReplayResult.summed) instead of a pass over
the log; they must equal count() over the log it wrote and the Python reference's totals, whole or in progress
chunks, for every split and capacity. A generic-driver policy has no such sums and still counts from its log."""

from __future__ import annotations

import numpy as np
import pytest

from freetoken.placement import make_policy
from freetoken.placement.counts import count
from freetoken.sim.calls import trace_stream
from freetoken.sim.replay import replay, replay_stream
from tests.test_compiled_policies import SPLITS, capacities, real, synthetic

EXPERT_BYTES = 1000


def _check(trace, chunk: int, name: str) -> int:
    stream = trace_stream(trace, chunk)
    calls = list(stream.calls())
    L, E = trace.num_layers, trace.num_experts
    fetched = 0
    for capacity in capacities(trace, stream):
        for split_name, split in SPLITS.items():
            ref = replay(calls, make_policy(name, capacity, L, E, reference=True), split, expert_bytes=EXPERT_BYTES)
            whole = replay_stream(stream, make_policy(name, capacity, L, E), split, expert_bytes=EXPERT_BYTES)
            steps: list[int] = []
            chunked = replay_stream(stream, make_policy(name, capacity, L, E), split, expert_bytes=EXPERT_BYTES,
                                    on_call=steps.append)
            assert sum(steps) == stream.num_calls and (len(steps) > 1 or stream.num_calls < 2)
            assert (whole.summed is not None) == (name == "lru"), name  # only LRU's stream replay sums
            want = ref.total
            for got in (whole, chunked):
                assert got.total == want, (name, split_name, capacity)
                assert got.total == count(got.log, None, EXPERT_BYTES), (name, split_name, capacity)
                assert np.array_equal(got.log.experts, ref.log.experts)
                assert np.array_equal(got.log.tokens, ref.log.tokens)
            assert whole.total is not whole.total  # a fresh record each time, as count() gives
            fetched += want.fetched
    return fetched


@pytest.mark.parametrize("name", ["lru", "s3fifo"])
def test_totals_synthetic(name):
    assert _check(synthetic(0, T=40), 5, name) > 0


def test_totals_mixtral_slice():
    trace, chunk = real("mixtral")
    assert _check(trace, chunk, "lru") > 0


def test_counts_copy_is_every_field():
    from dataclasses import fields

    from freetoken.placement.counts import Counts

    record = Counts(*range(1, len(fields(Counts)) + 1))
    copied = record.copy()
    assert copied == record and copied is not record


def test_per_request_counts_equal_a_masked_count_per_request():
    """by_request groups the log in one pass per column; the reference is count() over each request's mask. Requests
    interleave (batched continuous replay orders calls across requests) and ids need not be 0..R-1."""
    from freetoken.sim.replay import ReplayLog, ReplayResult

    rng = np.random.default_rng(3)
    C = 500
    cols = {c: rng.integers(0, 50, C) for c in ("hits", "fetched", "cpu", "evictions", "prefetched", "cpu_tokens",
                                                "experts", "tokens", "hit_tokens", "fetch_tokens")}
    request = rng.choice(np.array([7, 2, 40, 3]), C)  # [C] interleaved, not contiguous ids
    log = ReplayLog(np.zeros(C, np.int64), np.zeros(C, np.int8), request, **cols)
    result = ReplayResult("lru", "offload", 4, log, EXPERT_BYTES)
    got = result.by_request()
    assert list(got) == [2, 3, 7, 40]
    assert got == {r: count(log, request == r, EXPERT_BYTES) for r in (2, 3, 7, 40)}
    assert sum(c.hits for c in got.values()) == int(cols["hits"].sum())


def test_counts_of_a_small_log_by_hand():
    from freetoken.placement.counts import Counts, count_by
    from tests.test_cost_lanes import log_of

    log = log_of(dict(phase=0, request=0, hits=2, fetched=1, prefetched=1),
                 dict(phase=1, request=0, fetched=2, cpu=1, evictions=1, cpu_tokens=3),
                 dict(phase=1, request=1, hits=1, cpu=1, cpu_tokens=1))
    total = count(log, None, 10)  # fetched bytes: (3 fetched + 1 prefetched) x 10
    assert total == Counts(calls=3, hits=3, fetched=3, cpu=2, evictions=1, prefetched=1, cpu_tokens=4,
                           fetched_bytes=40)
    assert (total.misses, total.accesses, total.hit_rate) == (5, 8, 3 / 8)
    assert total.to_dict()["miss_rate"] == 5 / 8
    assert count(log, np.array([False, True, True]), 10) == Counts(2, 1, 2, 2, 1, 0, 4, 20)
    assert count_by(log, log.request, 10) == {0: Counts(2, 2, 3, 1, 1, 1, 3, 40), 1: Counts(1, 1, 0, 1, 0, 0, 1, 0)}
    assert count(log).fetched_bytes == 0 and count_by(log, log.request)[0].fetched_bytes == 0  # no expert size given
    empty = Counts()
    assert empty == Counts(0, 0, 0, 0, 0, 0, 0, 0)
    assert (empty.hit_rate, empty.to_dict()["miss_rate"]) == (0.0, 0.0)
