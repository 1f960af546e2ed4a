"""The victim searches that keep work between the evictions of one call (belady's set-aside heap entries,
s3fifo's protected counts, layer_sweep's heap walk, shared by lookahead and hinted_sweep) against plain ones
written here: every eviction recomputed from scratch over all residents, by each policy's documented rule.
Compared plan by plan on random streams whose prefill calls evict many times each."""

from __future__ import annotations

import math

import pytest

from freetoken.placement import Split
from freetoken.placement.policies.belady import Belady
from freetoken.placement.policies.sweep.hinted_sweep import HintedSweep
from freetoken.placement.policies.sweep.layer_sweep import LayerSweep
from freetoken.placement.policies.sweep.lookahead import Lookahead
from freetoken.placement.policies.s3fifo import S3FIFO
from freetoken.sim.calls import trace_calls, trace_key_stream
from freetoken.sim.synth import SynthSpec, synthesize


class PlainBelady(Belady):
    def victim(self, key, now, protected):
        cands = [k for k in self._due if k not in protected]
        if not cands:
            return None
        out = max(cands, key=lambda k: (self._due[k], -k))  # furthest next use, ties: lowest key
        if self.bypass and self._due_now[key] >= self._due[out]:
            return None
        return out


class PlainS3FIFO(S3FIFO):
    def victim(self, key, now, protected):
        s, m, freq = self._s, self._m, self._freq
        held_s = sum(1 for k in protected if k in s)  # counted afresh at every eviction
        held_m = sum(1 for k in protected if k in m)
        if held_s + held_m >= len(s) + len(m):
            return None
        while True:
            if len(s) > held_s and (len(s) >= self._small_target or len(m) == held_m):
                k = next(iter(s))
                if k in protected:
                    s.move_to_end(k)
                elif freq[k] > 1:
                    del s[k]
                    m[k] = None
                else:
                    return k
            else:
                k = next(iter(m))
                if k in protected:
                    m.move_to_end(k)
                elif freq[k] > 0:
                    freq[k] -= 1
                    m.move_to_end(k)
                else:
                    return k


def plain_walk(policy, key, protected, resident_wait, bound):
    """layer_sweep's rule over all residents sorted by (z, key): walk from the least likely, stop when the bound
    falls under the best wait so far (or the wait to beat), or after `scan` unprotected keys."""
    shift = policy._most_visits * policy._log_decay
    to_beat = policy._to_beat(key)
    best, best_wait, budget = None, -math.inf, policy.scan
    for z, k in sorted((z, k) for k, z in policy._z.items()):
        log_p = z + shift
        if not budget or (log_p > -700.0 and bound(log_p) < max(best_wait, to_beat)):
            break
        if k in protected:
            continue
        budget -= 1
        w = resident_wait(k)
        if w > best_wait or (w == best_wait and k < best):
            best, best_wait = k, w
    return None if best is None or to_beat > best_wait else best


def _sweep_bound(policy):
    return lambda log_p: policy.num_layers * math.exp(-log_p) * (1 - 1e-9)


class PlainSweep(LayerSweep):
    def victim(self, key, now, protected):
        return plain_walk(self, key, protected, lambda k: LayerSweep.wait(self, k), _sweep_bound(self))


class PlainLookahead(Lookahead):
    def victim(self, key, now, protected):
        protected = protected | self._pending
        return plain_walk(self, key, protected, lambda k: LayerSweep.wait(self, k), _sweep_bound(self))


class PlainHinted(HintedSweep):
    def victim(self, key, now, protected):
        bound = lambda log_p: self.num_layers * (1.0 + math.exp(-log_p)) * (1 - 1e-9)  # noqa: E731
        return plain_walk(self, key, protected, self.wait, bound)


PAIRS = {  # name -> (policy under test, plain twin, options)
    "belady": (Belady, PlainBelady, {}),
    "belady-classic": (Belady, PlainBelady, {"bypass": False}),
    "s3fifo": (S3FIFO, PlainS3FIFO, {"small": 0.25}),
    "layer_sweep": (LayerSweep, PlainSweep, {"decay": 0.8, "scan": 3}),
    "layer_sweep-nobypass": (LayerSweep, PlainSweep, {"decay": 0.95, "bypass": False}),
    "lookahead": (Lookahead, PlainLookahead, {"accuracy": 0.7, "depth": 2, "scan": 4}),
    "hinted_sweep": (HintedSweep, PlainHinted, {"accuracy": 0.8, "depth": 2, "min_confidence": 0.3, "scan": 4}),
}
SPLITS = [Split(), Split("hybrid", "max_fetch", max_fetch=2, fetch_order="most_recent"),
          Split("offload", admit_prefill=False)]


CASES = {  # SynthSpec fields, prefill chunk, calls that must evict more than once
    "4-layers-a": (dict(num_layers=4, num_experts=8, top_k=3, skew=0.7, reuse=0.3, seed=0), 4, 10),
    "4-layers-b": (dict(num_layers=4, num_experts=8, top_k=3, skew=0.7, reuse=0.3, seed=1), 4, 10),
    "1-layer": (dict(num_layers=1, num_experts=12, top_k=3, skew=0.7, reuse=0.3, seed=2), 4, 5),
    # one layer, skewed: a call often repeats the previous one's keys (the same protected set, new waits)
    "1-layer-repeats": (dict(num_layers=1, num_experts=6, top_k=2, skew=1.5, reuse=0.6, seed=0), 1, 0),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_kept_walk_equals_plain_victim_search_plan_by_plan(name, case):
    cls, plain, options = PAIRS[name]
    fields, chunk, min_multi = CASES[case]
    L, E = fields["num_layers"], fields["num_experts"]
    trace = synthesize(SynthSpec(num_tokens=120, num_requests=3, **fields))
    calls = list(trace_calls(trace, chunk))
    largest = max(len(c.experts) for c in calls)
    evicting_calls = 0
    for capacity in sorted({min(c, L * E) for c in (0, 1, largest - 1, 3, 8, 16, L * E)}):
        for split in SPLITS:
            opts = dict(options)
            if cls.needs_future:
                opts["future"] = trace_key_stream(trace, chunk)
            fast = cls(capacity, L, E, **opts)
            if cls.needs_future:
                opts["future"] = trace_key_stream(trace, chunk)
            ref = plain(capacity, L, E, **opts)
            for i, call in enumerate(calls):
                got, want = fast.plan(call, split), ref.plan(call, split)
                assert got == want, (name, capacity, split, i)
                evicting_calls += len(got.evict) > 1
            assert fast.slot_of == ref.slot_of
    assert evicting_calls >= min_multi  # the kept state was exercised across evictions of one call
