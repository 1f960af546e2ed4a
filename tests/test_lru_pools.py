"""lru's pool scopes against a brute-force restatement written here (a recency list, no policy code), reference and
compiled, under the offload split: per_layer quotas (equal / profile), a layer at its quota evicts its own least
recent key, one under it the least recent key of the layer most over its quota."""

from __future__ import annotations

import numpy as np
import pytest
from test_policy_reference import random_trace

from freetoken.placement import Split, make_policy
from freetoken.placement.policies.lru import layer_quotas
from freetoken.trace.stats import expert_counts
from freetoken.sim.calls import trace_calls
from freetoken.sim.replay import replay


def ref_pools(calls, L, E, capacity, quota):
    """Per call: (hits, fetched keys kept, evicted keys)."""
    order, out = [], []  # resident keys, least recent first
    for call in calls:
        keys = [call.layer * E + e for e in call.experts]
        hits = sorted(k for k in keys if k in order)
        kept, evicted = [], []
        for k in keys:
            if k in order:
                order.remove(k)
                order.append(k)
                continue
            if not capacity:
                continue
            if len(order) < capacity:
                order.append(k)
                kept.append(k)
                continue
            held = [sum(1 for r in order if r // E == i) for i in range(L)]
            layer = k // E
            if held[layer] < quota[layer]:
                over = [h - q for h, q in zip(held, quota)]
                layer = min(range(L), key=lambda i: (-over[i], i))
            cands = [r for r in order if r // E == layer and r not in keys]
            if cands:
                order.remove(cands[0])
                evicted.append(cands[0])
                order.append(k)
                kept.append(k)
        out.append((hits, sorted(kept), evicted))
    return out


def test_quotas_by_hand():
    assert layer_quotas(7, 3, 6, "equal") == [3, 2, 2]
    used = np.array([[1, 1, 1, 0, 0, 0], [1] * 6, [1, 0, 0, 0, 0, 0]])
    assert layer_quotas(7, 3, 6, "profile", used) == [2, 4, 1]  # shares 2.1, 4.2, 0.7: the 0.7 remainder wins
    assert layer_quotas(17, 3, 6, "profile", used) == [6, 6, 5]  # capped at E: the rest to the open layers


@pytest.mark.parametrize("reference", [True, False], ids=["reference", "compiled"])
@pytest.mark.parametrize("split", ["equal", "profile"])
def test_plans_match_brute_force(split, reference):
    evictions = 0
    for seed in range(3):
        trace = random_trace(seed, T=60)
        L, E = trace.num_layers, trace.num_experts
        calls = list(trace_calls(trace, prefill_chunk=3))
        profile = expert_counts(random_trace(seed + 7, skew=3.0))  # a skewed profile: unequal quotas
        for capacity in (0, 1, 4, 7, 12, L * E):
            quota = layer_quotas(capacity, L, E, split, profile)
            pol = make_policy("lru", capacity, L, E, reference=reference, scope="per_layer", split=split,
                              profile=profile)
            got = replay(calls, pol, Split("offload"), keep_plans=True).plans
            want = ref_pools(calls, L, E, capacity, quota)
            for c, (plan, (hits, kept, evicted)) in enumerate(zip(got, want)):
                base = plan.layer * E
                assert sorted(base + e for e in plan.hits) == hits, (seed, capacity, c)
                assert sorted(base + e for e, s in zip(plan.fetch, plan.fetch_slots) if s >= 0) == kept, (seed, c)
                assert [lay * E + e for lay, e in plan.evict] == evicted, (seed, capacity, c)
                evictions += len(evicted)
    assert evictions > 0


def test_bad_options_are_one_line():
    with pytest.raises(ValueError, match="lru scope 'global' is not one of unified, per_layer"):
        make_policy("lru", 4, 2, 4, scope="global")
    with pytest.raises(ValueError, match="split=profile needs a profile"):
        make_policy("lru", 4, 2, 4, scope="per_layer", split="profile")
