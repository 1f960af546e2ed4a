"""The prefetch hook of PlacementPolicy, worked by hand on an LRU that prefetches what it is told, and its counts
in the replay log."""

from freetoken.placement import DECODE, LRU, Call, Split, make_policy
from freetoken.sim.replay import replay


class ToldLRU(LRU):
    """LRU that prefetches, after each call, the keys of a script (one list per call)."""

    name = "told_lru"

    def __init__(self, capacity, num_layers, num_experts, script):
        super().__init__(capacity, num_layers, num_experts)
        self.script = list(script)
        self.prefetched_at = []

    def prefetch_for(self, call):
        return self.script.pop(0) if self.script else []

    def on_prefetch(self, key, now):
        self.prefetched_at.append((key, now))


OFF = Split("offload")


def test_prefetch_fills_free_slots_then_evicts_through_victim_never_the_calls_keys():
    # 2 layers x 4 experts (key = layer * 4 + expert), capacity 3.
    # call 1: layer 0 {0, 1} -> fetched into slots 0, 1; prefetch key 6 (layer 1, expert 2) -> free slot 2.
    pol = ToldLRU(3, 2, 4, [[6], [7, 0, 1, 6]])
    p1 = pol.plan(Call(0, [0, 1], [1, 1], DECODE), OFF)
    assert (p1.fetch_slots, p1.prefetch, p1.evict) == ([0, 1], [(1, 2)], [])
    assert pol.slot(1, 2) == 2 and pol.clock == 2  # a prefetch is no access: the clock counts 2 accesses
    assert pol.prefetched_at == [(6, 2)]
    # call 2: layer 1 {2}: a hit thanks to the prefetch. Then prefetch 7, 0, 1, 6:
    # 7 needs a victim; LRU order is 0, 1, 6(=this call's key, protected) -> 0 goes (slot 0).
    # 0 is not resident now: it needs a victim; 1 is next in LRU order (7 was prefetched this call: protected).
    # 1 then finds only protected keys (6 = the call's, 7 and 0 = prefetched now): not copied. 6 is resident.
    p2 = pol.plan(Call(1, [2], [1], DECODE), OFF)
    assert (p2.hits, p2.hit_slots, p2.fetch) == ([2], [2], [])
    assert p2.prefetch == [(1, 3), (0, 0)]
    assert p2.evict == [(0, 0), (0, 1)]
    assert pol.resident() == {(1, 2): 2, (1, 3): 0, (0, 0): 1}


def test_replay_counts_prefetches_as_transfers():
    pol = ToldLRU(3, 2, 4, [[6], [7, 0, 1, 6]])
    calls = [Call(0, [0, 1], [1, 1], DECODE), Call(1, [2], [1], DECODE)]
    r = replay(calls, pol, OFF, expert_bytes=10)
    assert r.log.prefetched.tolist() == [1, 2]
    assert r.log.evictions.tolist() == [0, 2]
    t = r.total
    assert (t.fetched, t.prefetched, t.hits) == (2, 3, 1)
    assert t.fetched_bytes == (2 + 3) * 10  # a prefetch moves bytes over PCIe like a fetch


def test_policies_without_the_hook_prefetch_nothing():
    calls = [Call(l, [e, (e + 1) % 4], [1, 1], DECODE) for e in range(4) for l in range(2)]
    for name in ("lru", "s3fifo", "layer_sweep"):
        pol = make_policy(name, 3, 2, 4)
        assert all(pol.plan(c, OFF).prefetch == [] for c in calls), name


def test_prefetch_is_skipped_by_pinned_policies():
    from freetoken.placement import StaticLayers

    class ToldStatic(StaticLayers):
        def prefetch_for(self, call):
            return [0]

    pol = ToldStatic(4, 2, 4)  # layer 1 resident, layer 0 on the CPU: no slot may change
    plan = pol.plan(Call(1, [0], [1], DECODE), OFF)
    assert plan.prefetch == [] and sorted(pol.resident()) == [(1, e) for e in range(4)]
