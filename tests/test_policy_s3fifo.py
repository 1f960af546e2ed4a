"""s3fifo against a brute-force replay written here from the algorithm's statement (plain lists, oldest first),
compared plan by plan."""

import pytest

from freetoken.placement import DECODE, Call, Split, make_policy
from freetoken.placement.policies.s3fifo import S3FIFO
from freetoken.sim.calls import trace_calls
from freetoken.sim.synth import SynthSpec, synthesize


class BruteS3FIFO:
    def __init__(self, capacity, E, small=0.1):
        self.E = E
        self.small_target = max(1, int(small * capacity))
        self.ghost_size = max(1, capacity - self.small_target)
        self.S, self.M, self.G = [], [], []
        self.freq, self.slot = {}, {}
        self.free = list(range(capacity))

    def evict_one(self, protected):
        S, M = self.S, self.M
        if all(k in protected for k in S + M):
            return None
        while True:
            s_free = [k for k in S if k not in protected]
            m_free = [k for k in M if k not in protected]
            if s_free and (len(S) >= self.small_target or not m_free):
                k = S.pop(0)
                if k in protected:
                    S.append(k)
                elif self.freq[k] > 1:
                    M.append(k)
                else:
                    self.G.append(k)
                    if len(self.G) > self.ghost_size:
                        self.G.pop(0)
                    return k
            else:
                k = M.pop(0)
                if k in protected:
                    M.append(k)
                elif self.freq[k] > 0:
                    self.freq[k] -= 1
                    M.append(k)
                else:
                    return k

    def plan(self, call):
        E = self.E
        keys = [call.layer * E + e for e in call.experts]
        was = {k: k in self.slot for k in keys}
        hits, hit_slots, fetch, fetch_slots, evict = [], [], [], [], []
        for k in keys:
            if was[k]:
                self.freq[k] = min(3, self.freq[k] + 1)
                hits.append(k % E)
                hit_slots.append(self.slot[k])
                continue
            fetch.append(k % E)
            if self.free:
                s = self.free.pop(0)
            else:
                out = self.evict_one(set(keys))
                if out is None:
                    fetch_slots.append(-1)
                    continue
                s = self.slot.pop(out)
                del self.freq[out]
                evict.append(divmod(out, E))
            self.slot[k] = s
            self.freq[k] = 0
            if k in self.G:
                self.G.remove(k)
                self.M.append(k)
            else:
                self.S.append(k)
            fetch_slots.append(s)
        return hits, hit_slots, fetch, fetch_slots, evict


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("capacity", [1, 2, 5, 9, 14])
def test_s3fifo_matches_brute_force_plan_by_plan(seed, capacity):
    spec = SynthSpec(num_layers=3, num_experts=6, top_k=2, num_tokens=120, num_requests=2, skew=1.2, reuse=0.5,
                     seed=seed)
    pol = make_policy("s3fifo", capacity, 3, 6)
    ref = BruteS3FIFO(capacity, 6)
    for i, call in enumerate(trace_calls(synthesize(spec), 4)):
        plan = pol.plan(call, Split("offload"))
        assert (plan.hits, plan.hit_slots, plan.fetch, plan.fetch_slots, plan.evict) == ref.plan(call), f"call {i}"


def test_s3fifo_by_hand_a_reused_key_survives_a_scan():
    # 1 layer, 10 experts, capacity 5: small queue 1 slot (10% -> 1), main 4, ghost 4.
    # 0 0 0: key 0 hit twice (freq 2); 1 2 3 4 fill the free slots, all five in S. Key 5 needs a victim: S's
    # oldest is 0 with freq 2 > 1 -> it moves to M; then 1 (freq 0) leaves for the ghost. 6, 7, 8 evict 2, 3, 4
    # from S while 0 sits in M, so 0 still hits at the end. LRU has pushed 0 out by then.
    pol = S3FIFO(5, 1, 10)
    seq = [0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0]
    plans = [pol.plan(Call(0, [e], [1], DECODE), Split("offload")) for e in seq]
    assert [bool(p.hits) for p in plans] == [False, True, True] + [False] * 8 + [True]
    lru = make_policy("lru", 5, 1, 10)
    assert not [lru.plan(Call(0, [e], [1], DECODE), Split("offload")).hits for e in seq][-1]


def test_s3fifo_rejects_bad_small_share():
    with pytest.raises(ValueError, match="small"):
        S3FIFO(4, 1, 8, small=1.0)
