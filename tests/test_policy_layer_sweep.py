"""layer_sweep against a brute-force replay written here: every key's rate updated eagerly at every visit of its
layer, the victim found by scanning all residents. Compared plan by plan."""

import numpy as np
import pytest

from freetoken.placement import Split, make_policy
from freetoken.placement.policies.sweep.layer_sweep import LayerSweep, visit_rates
from freetoken.sim.calls import trace_calls
from freetoken.sim.synth import SynthSpec, synthesize


class BruteSweep:
    """Offload split: every miss is fetched; a key of the call is never evicted for another key of it."""

    def __init__(self, capacity, L, E, decay, bypass=True, prior=None):
        self.C, self.L, self.E, self.g, self.bypass = capacity, L, E, decay, bypass
        self.p = np.zeros(L * E) if prior is None else np.asarray(prior, float).reshape(-1).copy()
        self.slot = {}  # key -> slot
        self.free = list(range(capacity))  # lowest free slot first
        self.layer = 0
        if prior is not None:
            for k in sorted(range(L * E), key=lambda k: (-self.p[k], k))[:capacity]:
                self.slot[k] = self.free.pop(0)

    def wait(self, k, pending=()):
        d = (k // self.E - self.layer - 1) % self.L + 1
        if k in pending:
            return float(d)
        return d + self.L * (1.0 / max(self.p[k], 1e-300) - 1.0)

    def choose(self, key, protected, pending=()):
        """(victim or None, cache it?)"""
        cands = [k for k in self.slot if k not in protected]
        if not cands:
            return None, False
        best = max(cands, key=lambda k: (self.wait(k), -k))
        if self.bypass and self.wait(key, pending) > self.wait(best):
            return None, False
        return best, True

    def admit(self, key, protected, evict, pending=()):
        if self.free:
            s = self.free.pop(0)
        else:
            out, ok = self.choose(key, protected, pending)
            if not ok:
                return -1
            s = self.slot.pop(out)
            evict.append(divmod(out, self.E))
        self.slot[key] = s
        return s

    def plan(self, call, pending=()):
        E = self.E
        self.layer = call.layer
        keys = [call.layer * E + e for e in call.experts]
        lo = call.layer * E
        self.p[lo:lo + E] *= self.g  # one visit of this layer: every key's rate decays
        was = {k: k in self.slot for k in keys}
        hits, hit_slots, fetch, fetch_slots, evict = [], [], [], [], []
        for k in keys:
            self.p[k] += 1 - self.g
            if was[k]:
                hits.append(k - lo)
                hit_slots.append(self.slot[k])
            else:
                fetch.append(k - lo)
                fetch_slots.append(self.admit(k, set(keys) | set(pending), evict, pending))
        return hits, hit_slots, fetch, fetch_slots, evict


def _calls(seed, L=3, E=5, K=2, chunk=3):
    spec = SynthSpec(num_layers=L, num_experts=E, top_k=K, num_tokens=80, num_requests=2, skew=0.8, reuse=0.4,
                     seed=seed)
    return list(trace_calls(synthesize(spec), chunk))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("capacity", [1, 3, 6, 10])
@pytest.mark.parametrize("decay,bypass", [(0.9, True), (0.5, True), (0.8, False)])
def test_layer_sweep_matches_brute_force_plan_by_plan(seed, capacity, decay, bypass):
    calls = _calls(seed)
    pol = make_policy("layer_sweep", capacity, 3, 5, decay=decay, bypass=bypass)
    ref = BruteSweep(capacity, 3, 5, decay, bypass)
    for i, call in enumerate(calls):
        plan = pol.plan(call, Split("offload"))
        want = ref.plan(call)
        assert (plan.hits, plan.hit_slots, plan.fetch, plan.fetch_slots, plan.evict) == want, f"call {i}"
    assert {k for k in pol.slot_of} == set(ref.slot)


def test_layer_sweep_with_a_prior_starts_warm_and_matches_brute_force():
    calls = _calls(5)
    prior = visit_rates(_calls(6), 3, 5)  # [L, E] from another trace
    pol = LayerSweep(6, 3, 5, decay=0.9, prior=prior)
    ref = BruteSweep(6, 3, 5, 0.9, prior=prior)
    assert pol.slot_of == ref.slot  # the six highest-rate keys, before any call
    for i, call in enumerate(calls):
        plan = pol.plan(call, Split("offload"))
        assert (plan.hits, plan.hit_slots, plan.fetch, plan.fetch_slots, plan.evict) == ref.plan(call), f"call {i}"


def test_layer_sweep_evicts_the_layer_just_visited_on_a_cycle():
    # 3 layers x 1 expert, capacity 2, decay 0.5, the sweep 0 1 2 0 1 2: every key has the same rate history at
    # its own visit, so the wait is set by d: after layer 2 misses, layer 1 (just visited, d = 2) is evicted
    # rather than layer 0 (needed next, d = 1). LRU evicts layer 0 and misses on every call.
    from freetoken.placement import DECODE, Call

    calls = [Call(l, [0], [1], DECODE) for _ in range(2) for l in range(3)]
    sweep = LayerSweep(2, 3, 1, decay=0.5, bypass=False)
    plans = [sweep.plan(c, Split("offload")) for c in calls]
    assert plans[2].evict == [(1, 0)]
    # call 3 (layer 0) hits. At call 4 (layer 1) key 0 was just used (rate 0.75, d 2: wait 2 + 3 * (1/0.75 - 1) = 3)
    # and key 2 has rate 0.5, d 1: wait 1 + 3 * (2 - 1) = 4 -> key 2 goes, so call 5 misses.
    assert [bool(p.hits) for p in plans] == [False, False, False, True, False, False]
    assert plans[4].evict == [(2, 0)]
    lru = make_policy("lru", 2, 3, 1)
    assert sum(len(lru.plan(c, Split("offload")).hits) for c in calls) == 0


def test_visit_rates_counts_calls_per_layer():
    from freetoken.placement import DECODE, Call

    calls = [Call(0, [1, 2], [1, 1], DECODE), Call(1, [0], [1], DECODE), Call(0, [2], [1], DECODE)]
    np.testing.assert_allclose(visit_rates(calls, 2, 3), [[0, 0.5, 1.0], [1.0, 0, 0]])


def test_visit_rates_of_a_call_stream_equal_the_call_loop():
    from freetoken.sim.calls import trace_stream

    trace = synthesize(SynthSpec(num_layers=4, num_experts=16, top_k=3, num_tokens=200, num_requests=3, seed=4))
    for chunk in (1, 7, 2048):
        stream = trace_stream(trace, chunk)
        by_stream = visit_rates(stream, trace.num_layers, trace.num_experts)
        assert np.array_equal(by_stream, visit_rates(stream.calls(), trace.num_layers, trace.num_experts))
        if chunk == 1:  # one token per call: every visit uses top_k experts
            np.testing.assert_allclose(by_stream.sum(axis=1), trace.top_k)
    with pytest.raises(ValueError, match="layers"):
        visit_rates(stream, trace.num_layers - 1, trace.num_experts)


def test_layer_sweep_rejects_bad_options():
    with pytest.raises(ValueError, match="decay"):
        LayerSweep(2, 2, 2, decay=1.0)
    with pytest.raises(ValueError, match="prior"):
        LayerSweep(2, 2, 2, prior=np.ones((3, 2)))
