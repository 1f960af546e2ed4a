"""Hand-worked cases of the shared `plan` semantics (set access, protection, staging)."""

import numpy as np
import pytest

from freetoken.placement import DECODE, LRU, Call, Split, StaticLayers, make_policy
from freetoken.placement.policies.belady import Belady
from freetoken.placement.stream import key_stream


def test_lru_never_evicts_a_key_of_the_current_call():
    # 1 layer, 4 experts, capacity 2. Call A = {0, 1} fills the cache; call B = {2, 1}:
    # 1 hits; 2 misses and must evict 0 (not 1, which B uses, even though 0 and 1 are both older than 2).
    lru = LRU(2, 1, 4)
    off = Split("offload")
    p1 = lru.plan(Call(0, [0, 1], [1, 1], DECODE), off)
    assert (p1.hits, p1.fetch, p1.fetch_slots, p1.evict) == ([], [0, 1], [0, 1], [])
    p2 = lru.plan(Call(0, [2, 1], [1, 1], DECODE), off)
    assert (p2.hits, p2.hit_slots, p2.fetch, p2.fetch_slots, p2.evict) == ([1], [1], [2], [0], [(0, 0)])
    # call C = {0, 2, 3}: 2 hits; 0 and 3 miss; the LRU non-call key is 1 -> evicted for 0;
    # then no evictable key is left (all residents are C's), so 3 runs from staging (-1) and is not kept.
    p3 = lru.plan(Call(0, [0, 2, 3], [1, 1, 1], DECODE), off)
    assert (p3.hits, p3.fetch, p3.fetch_slots, p3.evict) == ([2], [0, 3], [1, -1], [(0, 1)])
    assert lru.resident() == {(0, 2): 0, (0, 0): 1}


def test_cpu_split_leaves_residency_alone():
    lru = LRU(4, 2, 4)
    plan = lru.plan(Call(1, [3, 2], [1, 1], DECODE), Split("cpu"))
    assert (plan.hits, plan.fetch, plan.cpu, plan.evict) == ([], [], [3, 2], [])
    assert lru.resident() == {}


def test_static_layers_fetches_to_staging_only():
    # 3 layers x 2 experts, capacity 4 -> floor(4/2) = 2 layers resident -> N = 1 CPU layer (layer 0)
    pol = StaticLayers(4, 3, 2)
    assert pol.n_cpu_layers == 1
    assert sorted(pol.resident()) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    plan = pol.plan(Call(0, [1, 0], [3, 1], 0), Split("offload"))  # a prefill chunk copied to the GPU
    assert (plan.fetch, plan.fetch_slots, plan.evict) == ([1, 0], [-1, -1], [])
    with pytest.raises(ValueError, match="n_cpu_layers=0"):
        StaticLayers(4, 3, 2, n_cpu_layers=0)  # needs 6 slots


def test_belady_evicts_the_furthest_next_use():
    # 1 layer, 3 experts, capacity 2, calls (one key each): 0 1 2 0 1 -> at call 2, key 1 is used again before 0?
    # next uses: 0 -> call 3, 1 -> call 4: evict 1 (furthest). Then 0 hits, 1 misses: 3 cold + 1 = 4 misses.
    calls = [Call(0, [e], [1], DECODE) for e in (0, 1, 2, 0, 1)]
    pol = Belady(2, 1, 3, future=key_stream(calls, 3), bypass=False)
    plans = [pol.plan(c, Split("offload")) for c in calls]
    # at call 4, residents 0 and 2 are both never used again: the tie goes to the lower key
    assert [p.evict for p in plans] == [[], [], [(0, 1)], [], [(0, 0)]]
    assert sum(p.num_misses for p in plans) == 4
    # with bypass, key 2 (never used again) is not cached at all: misses are the same, one fewer eviction
    pol = Belady(2, 1, 3, future=key_stream(calls, 3), bypass=True)
    plans = [pol.plan(c, Split("offload")) for c in calls]
    assert sum(p.num_misses for p in plans) == 3 + 0 + 0 and plans[2].fetch_slots == [-1]


def test_belady_refuses_a_future_that_does_not_match():
    calls = [Call(0, [0], [1], DECODE)]
    pol = Belady(1, 1, 2, future=key_stream(calls, 2))
    with pytest.raises(ValueError, match="future"):
        pol.plan(Call(0, [1], [1], DECODE), Split("offload"))


def test_make_policy_lists_valid_names_and_options():
    with pytest.raises(ValueError, match="valid: .*lru"):
        make_policy("lfu-magic", 4, 2, 4)
    with pytest.raises(ValueError, match="takes no option bogus"):
        make_policy("lru", 4, 2, 4, bogus=1)
    with pytest.raises(ValueError, match="capacity"):
        make_policy("lru", 9, 2, 4)
    with pytest.raises(ValueError, match="profile"):
        make_policy("frequency", 4, 2, 4)
    with pytest.raises(ValueError, match="shape"):
        make_policy("frequency", 4, 2, 4, profile=np.ones((3, 4)))


def test_streaming_prefill_leaves_the_cache_alone():
    # capacity 2, decode fills {0, 1}; a prefill chunk needs {2, 3, 0}: with admit_prefill=False both misses are
    # copied to staging (-1), nothing is evicted, and the next decode call still hits 0 and 1.
    stream = Split("offload", admit_prefill=False)
    lru = LRU(2, 1, 4)
    lru.plan(Call(0, [0, 1], [1, 1], DECODE), stream)
    pre = lru.plan(Call(0, [2, 3, 0], [5, 2, 1], 0), stream)
    assert (pre.hits, pre.fetch, pre.fetch_slots, pre.evict) == ([0], [2, 3], [-1, -1], [])
    after = lru.plan(Call(0, [1, 0], [1, 1], DECODE), stream)
    assert after.hits == [1, 0]
    # the default admits: the same prefill evicts 1 for 2 (0 is protected), then 3 finds no evictable slot
    lru = LRU(2, 1, 4)
    lru.plan(Call(0, [0, 1], [1, 1], DECODE), Split("offload"))
    pre = lru.plan(Call(0, [2, 3, 0], [5, 2, 1], 0), Split("offload"))
    assert (pre.fetch_slots, pre.evict) == ([1, -1], [(0, 1)])


def test_plan_from_kinds_by_hand_skips_the_padding_of_a_fixed_width_call():
    """The array form the compiled and device decisions write: kind 0 hit, 1 fetch, 2 cpu, -1 padding (the device
    decision's calls are padded to a fixed width); keys as layer * E + expert."""
    from freetoken.placement.call import Plan

    plan = Plan.from_kinds(1, [3, 5, 7, 0], [0, 1, 2, -1], [4, 9, -1, -1], evict_keys=[10], prefetch_keys=[14],
                           num_experts=8)
    assert (plan.hits, plan.hit_slots, plan.fetch, plan.fetch_slots, plan.cpu) == ([3], [4], [5], [9], [7])
    assert plan.evict == [(1, 2)] and plan.prefetch == [(1, 6)]
