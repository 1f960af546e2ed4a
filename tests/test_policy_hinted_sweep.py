"""hinted_sweep against a brute-force replay written here (every rate updated eagerly at each visit of its layer,
every victim found by scanning all residents, the Bayes posterior spelled out), plan by plan; the oracle's
per-distance accuracy; and the two limits the posterior must reach by hand."""

import math

import numpy as np
import pytest

from freetoken.placement import DECODE, Call, Split, key_stream, make_policy
from freetoken.placement.policies.sweep.hinted_sweep import DistanceOracle, HintedSweep, accuracies
from freetoken.sim.calls import trace_calls
from freetoken.sim.synth import SynthSpec, synthesize

L, E = 4, 5


class ScriptedHint:
    """Any keys, right or wrong, some outside the hint's depth (which the policy must ignore: earlier layers, the
    next step's, layers past `depth`)."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.log = []

    def upcoming(self, call):
        n = int(self.rng.integers(0, 5))
        keys = [int(k) for k in dict.fromkeys(self.rng.integers(0, L * E, size=n).tolist())]
        self.log.append(keys)
        return keys


class BruteHinted:
    def __init__(self, capacity, decay, acc, min_confidence, bypass=True):
        self.g, self.acc, self.min_conf, self.bypass = decay, acc, min_confidence, bypass
        self.p = np.zeros(L * E)
        self.slot, self.free = {}, list(range(capacity))
        self.layer, self.hinted, self.predicted = 0, {}, []

    def posterior(self, k):
        l = k // E
        if l not in self.hinted:
            return None
        a, n = self.hinted[l]
        q = min(1.0, n * (1 - a) / (E - 1))  # a wrong draw of one of n predictions lands on this unused key
        p = min(max(self.p[k], 0.25 * n / E), 1.0)
        if k in self.predicted:
            return p * a / (p * a + (1 - p) * q), p
        den = p * (1 - a) + (1 - p) * (1 - q)
        return (p * (1 - a) / den if den > 0 else 0.0), p

    def wait(self, k):
        d = (k // E - self.layer - 1) % L + 1
        post = self.posterior(k)
        if post is None:
            return d + L * (1.0 / max(self.p[k], 1e-300) - 1.0)
        r, p = post
        return d + (1 - r) * L / p

    def admit(self, k, protected, evict, test):
        if self.free:
            s = self.free.pop(0)
        else:
            cands = [x for x in self.slot if x not in protected]
            if not cands:
                return -1
            best = max(cands, key=lambda x: (self.wait(x), -x))
            if test and self.wait(k) > self.wait(best):
                return -1
            s = self.slot.pop(best)
            evict.append(divmod(best, E))
        self.slot[k] = s
        return s

    def plan(self, call, hint):
        self.layer = call.layer
        self.predicted = [k for k in hint if call.layer < k // E <= call.layer + len(self.acc)]
        self.hinted = {}
        for k in self.predicted:
            l = k // E
            self.hinted[l] = (self.acc[l - call.layer - 1], self.hinted.get(l, (0, 0))[1] + 1)
        keys = [call.layer * E + e for e in call.experts]
        self.p[call.layer * E:(call.layer + 1) * E] *= self.g
        was = {k: k in self.slot for k in keys}
        hits, hit_slots, fetch, fetch_slots, evict = [], [], [], [], []
        for k in keys:
            self.p[k] += 1 - self.g
            if was[k]:
                hits.append(k % E)
                hit_slots.append(self.slot[k])
            else:
                fetch.append(k % E)
                fetch_slots.append(self.admit(k, set(keys), evict, self.bypass))
        protected, pre = set(keys), []
        for k in self.predicted:
            if k in self.slot or k in protected or self.posterior(k)[0] < self.min_conf:
                continue
            if self.admit(k, protected, evict, True) != -1:
                protected.add(k)
                pre.append(divmod(k, E))
        return hits, hit_slots, fetch, fetch_slots, evict, pre


def _calls(seed, chunk=3):
    spec = SynthSpec(num_layers=L, num_experts=E, top_k=2, num_tokens=90, num_requests=2, skew=0.8, reuse=0.4,
                     seed=seed)
    return list(trace_calls(synthesize(spec), chunk))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("capacity", [2, 5, 9])
@pytest.mark.parametrize("acc,min_conf,bypass", [((0.7, 0.5), 0.3, True), ((0.9, 0.8), 0.6, False),
                                                 ((1.0, 1.0), 0.5, True), ((0.8, 0.6), math.inf, True)])
def test_hinted_sweep_matches_brute_force_plan_by_plan(seed, capacity, acc, min_conf, bypass):
    calls = _calls(seed)
    hint = ScriptedHint(seed)
    pol = HintedSweep(capacity, L, E, hint=hint, accuracy=acc, depth=2, min_confidence=min_conf, decay=0.8,
                      bypass=bypass)
    got = [pol.plan(c, Split("offload")) for c in calls]
    ref = BruteHinted(capacity, 0.8, acc, min_conf, bypass)
    for i, (p, call) in enumerate(zip(got, calls)):
        want = ref.plan(call, hint.log[i])
        assert (p.hits, p.hit_slots, p.fetch, p.fetch_slots, p.evict, p.prefetch) == want, f"call {i}"
    assert set(pol.slot_of) == set(ref.slot)
    if min_conf < 1 and capacity == 9:  # room beside the call: some hint passes the test
        assert sum(len(p.prefetch) for p in got) > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_measure_weighs_each_hint_by_its_running_accuracy(seed):
    """measure=True makes the Plans of the same policy whose assumed accuracy, call by call, is the tally written
    here: of the keys each layer's calls used, the share the hint of the call before (one layer down) named."""
    calls = _calls(seed, chunk=1)
    hint = ScriptedHint(seed)
    acc = (0.7, 0.5)
    got = HintedSweep(5, L, E, hint=hint, accuracy=acc, depth=2, min_confidence=0.3, decay=0.8, measure=True)
    plans = [got.plan(c, Split("offload")) for c in calls]
    ref = HintedSweep(5, L, E, hint=type("Log", (), {"upcoming": lambda s, c, it=iter(hint.log): next(it)})(),
                      accuracy=acc, depth=2, min_confidence=0.3, decay=0.8)
    right, used = [0] * L, [0] * L
    for i, call in enumerate(calls):
        if i and calls[i - 1].layer == call.layer - 1:
            named = {k for k in hint.log[i - 1] if k // E == call.layer}
            true = {call.layer * E + e for e in call.experts}
            right[call.layer] += len(named & true)
            used[call.layer] += len(true)
        nxt = call.layer + 1
        ref.acc = ((right[nxt] / used[nxt]) if nxt < L and used[nxt] else acc[0], acc[1])
        assert ref.plan(call, Split("offload")) == plans[i], f"call {i}"
    assert got.measured_accuracy() == pytest.approx([r / u if u else math.nan for r, u in zip(right, used)],
                                                    nan_ok=True)
    assert sum(used) > 0


def test_posterior_limits_by_hand():
    # 2 layers x 4 experts, capacity 4: no hint for layer 1 -> layer_sweep's wait. Call 0 on layer 0 uses
    # expert 0 at decay 0.5: p(0, 0) = 0.5. Keys of layer 1 have p = 0, so their prior p is floored at
    # 0.25 * n / E with n predictions in the layer.
    class Fixed:
        def __init__(self, keys):
            self.keys = keys

        def upcoming(self, call):
            return self.keys

    perfect = HintedSweep(4, 2, 4, hint=Fixed([4 + 1]), accuracy=1.0, decay=0.5, min_confidence=math.inf)
    perfect.plan(Call(0, [0], [1], DECODE), Split("offload"))
    assert perfect.wait(5) == 1.0  # a right hint: needed at the very next call
    assert perfect.wait(6) == 1 + 2 / (0.25 * 1 / 4)  # not named: d + L / p_floor, a full sweep more
    assert perfect.wait(0) == 2 + 2 * (1 / 0.5 - 1)  # layer 0 is not hinted: layer_sweep's d + L (1/p - 1)
    half = HintedSweep(4, 2, 4, hint=Fixed([4 + 1]), accuracy=0.5, decay=0.5, min_confidence=math.inf)
    half.plan(Call(0, [0], [1], DECODE), Split("offload"))
    # q = 1 * 0.5 / 3 = 1/6, p = 1/16: named r = (p / 2) / (p / 2 + (15/16) / 6) = (1/32) / (1/32 + 5/32) = 1/6
    assert half.confidence(5) == pytest.approx(1 / 6)
    # not named: r = (p / 2) / (p / 2 + (15/16)(5/6)) = (1/32) / (1/32 + 25/32) = 1/26
    assert half.confidence(6) == pytest.approx(1 / 26)


def test_distance_oracle_accuracy_falls_with_distance():
    spec = SynthSpec(num_layers=4, num_experts=16, top_k=2, num_tokens=3000, num_requests=2, seed=1)
    calls = list(trace_calls(synthesize(spec), 1))
    oracle = DistanceOracle(key_stream(calls, 16), 16, (0.9, 0.6), seed=2)
    right, total = [0, 0], [0, 0]
    for c, call in enumerate(calls):
        hint = oracle.upcoming(call)
        for j in (1, 2):
            if call.layer + j >= 4:
                assert all(k // 16 < 4 for k in hint)
                continue
            true = {(call.layer + j) * 16 + e for e in calls[c + j].experts}
            named = {k for k in hint if k // 16 == call.layer + j}
            right[j - 1] += len(named & true)
            total[j - 1] += len(true)
    # 3000 tokens, 2 picks: 3 sigma of a binomial share at n = 12000 (distance 1) is 0.008 (0.9), 0.013 (0.6);
    # a wrong draw hits the other true pick with chance 1/15 (a small downward bias)
    assert abs(right[0] / total[0] - 0.9) < 0.02 and abs(right[1] / total[1] - 0.6) < 0.03


def test_accuracy_forms_and_bad_options():
    assert accuracies(0.9, 3) == pytest.approx((0.9, 0.81, 0.729))
    assert accuracies([1.0, 0.5], 2) == (1.0, 0.5)
    with pytest.raises(ValueError, match="accuracy"):
        accuracies([0.9], 2)
    with pytest.raises(ValueError, match="router hint"):
        make_policy("hinted_sweep", 4, 2, 4)


def test_no_prefetch_and_no_hint_is_layer_sweep():
    calls = _calls(4)
    empty = type("Empty", (), {"upcoming": lambda self, call: []})()
    a = HintedSweep(5, L, E, hint=empty, decay=0.8)
    b = make_policy("layer_sweep", 5, L, E, decay=0.8)
    for call in calls:
        assert a.plan(call, Split("offload")) == b.plan(call, Split("offload"))
