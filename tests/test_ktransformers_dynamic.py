"""ktransformers_dynamic against a brute-force restatement written here (sets and sorted lists, no policy code):
pinned start from the fair frequency rule, demand misses never admitted, re-pin every `window` passes of the last
layer from the counts since the last re-pin, and per layer after a long prefill call."""

from __future__ import annotations

import numpy as np
import pytest
from test_policy_reference import random_trace, ref_frequency

from freetoken.placement import PREFILL, Split, make_policy
from freetoken.trace.stats import expert_counts
from freetoken.sim.calls import trace_calls
from freetoken.sim.replay import replay


def ref_dynamic(calls, L, E, capacity, profile, strategy, window, prefill_pairs):
    """Per call: (hits, fetched, evicted keys, prefetched keys) under the offload split."""
    K = L * E
    resident = set(ref_frequency(profile, capacity, "per_layer", strategy))
    recent, passes, out = [0] * K, 0, []
    for call in calls:
        keys = [call.layer * E + e for e in call.experts]
        hits = sorted(k for k in keys if k in resident)
        fetched = sorted(k for k in keys if k not in resident)
        for k, t in zip(keys, call.tokens):
            recent[k] += t
        target, span = None, None
        if call.phase == PREFILL and sum(call.tokens) >= prefill_pairs:
            span = range(call.layer * E, (call.layer + 1) * E)
            mine = dict(zip(keys, call.tokens))
            score = {k: 2 * mine.get(k, 0) + (k in resident) for k in span}
            held = sum(k in resident for k in span)
            target = set(sorted(span, key=lambda k: (-score[k], k))[:held])
        elif call.layer == L - 1:
            passes += 1
            if passes == window:
                passes, span = 0, range(K)
                score = {k: 2 * recent[k] + (k in resident) for k in span}
                grid = np.array([score[k] for k in span]).reshape(L, E)
                target = set(ref_frequency(grid, capacity, "per_layer"))
                recent = [0] * K
        evicted, prefetched = [], []
        if target is not None and capacity:
            leavers = [k for k in sorted(span, key=lambda k: (score[k], k))
                       if k in resident and k not in target and k not in keys]
            incoming = [k for k in sorted(span, key=lambda k: (-score[k], k))
                        if k in target and k not in resident and k not in keys]
            for new, old in zip(incoming, leavers):
                resident.discard(old)
                resident.add(new)
                evicted.append(old)
                prefetched.append(new)
        out.append((hits, fetched, evicted, prefetched))
    return out


CASES = [("uniform", 2, 8), ("uniform", 3, 10 ** 9), ("frequency", 1, 6), ("front_loading", 4, 12)]


@pytest.mark.parametrize("reference", [True, False], ids=["reference", "compiled"])
@pytest.mark.parametrize("strategy, window, prefill_pairs", CASES)
def test_plans_match_brute_force(strategy, window, prefill_pairs, reference):
    repinned = 0
    for seed in range(3):
        trace = random_trace(seed)
        L, E = trace.num_layers, trace.num_experts
        calls = list(trace_calls(trace, prefill_chunk=3))
        profile = expert_counts(trace)
        for capacity in (0, 1, 4, 7, 12, L * E):
            pol = make_policy("ktransformers_dynamic", capacity, L, E, reference=reference, profile=profile,
                              strategy=strategy, window=window, prefill_pairs=prefill_pairs)
            got = replay(calls, pol, Split("offload"), keep_plans=True).plans
            want = ref_dynamic(calls, L, E, capacity, profile, strategy, window, prefill_pairs)
            for c, (plan, (hits, fetched, evicted, prefetched)) in enumerate(zip(got, want)):
                base = plan.layer * E
                assert sorted(base + e for e in plan.hits) == hits, (seed, capacity, c)
                assert sorted(base + e for e in plan.fetch) == fetched and plan.cpu == [], (seed, capacity, c)
                assert all(s == -1 for s in plan.fetch_slots), "a demand miss never takes a slot"
                assert [lay * E + e for lay, e in plan.evict] == evicted, (seed, capacity, c)
                assert [lay * E + e for lay, e in plan.prefetch] == prefetched, (seed, capacity, c)
                repinned += len(prefetched)
    assert repinned > 0  # the re-pin moved experts: the check is not vacuous


def test_bad_options_are_one_line():
    with pytest.raises(ValueError, match="window must be >= 1"):
        make_policy("ktransformers_dynamic", 4, 2, 4, window=0)
    with pytest.raises(ValueError, match="strategy 'hot' is not one of"):
        make_policy("ktransformers_dynamic", 4, 2, 4, strategy="hot")
    with pytest.raises(ValueError, match="needs a profile"):
        make_policy("ktransformers_dynamic", 4, 2, 4, strategy="frequency")
