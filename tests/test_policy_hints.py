"""The policy study's hint rows and time column: the offline window probe against layer_sweep (window 0) and the
Belady bound, and the rows against replays and cost-model charges made here."""

import math
from pathlib import Path

import numpy as np
import pytest

from freetoken.experiments import policy_study as ps
from freetoken.experiments.policy_hints import WindowedFuture, probe, variants
from freetoken.placement import Split, key_stream, make_policy
from freetoken.sim.calls import trace_calls
from freetoken.sim.synth import SynthSpec, synthesize


def _trace(seed=4):
    return synthesize(SynthSpec(num_layers=4, num_experts=8, top_k=2, num_tokens=160, num_requests=4, seed=seed))


@pytest.mark.parametrize("capacity", [3, 8, 14])
def test_window_zero_is_layer_sweep_plan_by_plan(capacity):
    calls = list(trace_calls(_trace(), 16))
    future = key_stream(calls, 8)
    probe_policy = WindowedFuture(capacity, 4, 8, future, window=0, decay=0.8)
    sweep = make_policy("layer_sweep", capacity, 4, 8, decay=0.8)
    for i, call in enumerate(calls):
        assert probe_policy.plan(call, Split("offload")) == sweep.plan(call, Split("offload")), f"call {i}"


class ScalarWindowedFuture(WindowedFuture):
    """The probe's victim by its definition, one key at a time: the reference for its vectorised scores."""

    def victim(self, key, now, protected):
        cands = [k for k in self.slot_of if k not in protected]
        if not cands:
            return None
        best = max(cands, key=lambda k: (self._score(k), -k))
        return None if self._score(key) > self._score(best) else best


@pytest.mark.parametrize("window, capacity, warm", [(1, 6, False), (4, 9, True), (16, 14, True), (64, 20, False)])
def test_probe_victim_equals_its_scalar_definition(shared_traces, window, capacity, warm):
    from freetoken.placement.policies.sweep.layer_sweep import visit_rates
    from freetoken.trace.importers import import_trace

    full = import_trace(shared_traces / "mixtral-8x7b" / "humaneval_2_routing.jsonl")
    trace = full.select(np.arange(full.num_tokens) < 120)
    calls = list(trace_calls(trace, 1))
    future = key_stream(calls, 8)
    prior = visit_rates(trace_calls(full.select(np.arange(full.num_tokens) >= 120), 1), 32, 8) if warm else None
    fast, slow = (cls(capacity * 8, 32, 8, future, window=window * 32, decay=0.9, prior=prior)
                  for cls in (WindowedFuture, ScalarWindowedFuture))
    evictions = 0
    for i, call in enumerate(calls):
        got = fast.plan(call, Split("offload"))
        assert got == slow.plan(call, Split("offload")), f"call {i}"
        evictions += len(got.evict)
    assert evictions > 100  # the victim ran


@pytest.mark.parametrize("window", [4, 16, 10**9])
def test_no_window_beats_belady(window):
    trace = _trace(5)
    for fraction in (0.25, 0.5):
        belady = ps._misses(trace, "belady", fraction, 16, {})[1]
        sweep = ps._misses(trace, "layer_sweep", fraction, 16, {"decay": 0.8})[1]
        got = probe(trace, window, fraction, 16, 0.8, None, None)[1]
        assert belady <= got  # cold start, as Belady: nothing copies less than MIN
        if window == 10**9:
            assert got < sweep  # the whole future known: fewer copies than the estimate alone


def test_hint_rows_are_the_replays_they_name_and_time_is_the_cost_model():
    trace = _trace()
    case = ps.Case("tiny", 16, False, lambda root: ps._request_folds(trace, [[0, 1], [2, 3]], "tiny"),
                   card="mixtral-8x7b", hints=True)
    rows = ps.run_case(case, Path("."), [0.25], ps.ONLINE)
    labels = [label for label, _ in variants(4)] + [f"offline: next use known {w} token(s) ahead"
                                                    for w in (1, 4, 16, 64)]
    got = {r["variant"]: r for r in rows if r["variant"] != "main"}
    assert list(got) == labels
    halves = [trace.select(np.isin(trace.request, g)) for g in ([0, 1], [2, 3])]
    rest = dict(variants(4))[labels[len(variants(4)) - 1]]
    assert rest == {"accuracy": 1.0, "depth": 3, "min_confidence": math.inf}
    from freetoken.placement.policies.sweep.layer_sweep import visit_rates
    from freetoken.sim.cost import CostOptions, call_meta, charge
    from freetoken.sim.hardware import load_hardware
    from freetoken.sim.model_card import load_model_card
    from freetoken.sim.run import SimConfig, simulate

    decays = [ps.fit_decay(h, 0.25, 16) for h in halves[::-1]]
    misses = seconds = 0
    for h, other, d in zip(halves, halves[::-1], decays):
        prior = visit_rates(trace_calls(other, 16), 4, 8)
        r = simulate(h, SimConfig("hinted_sweep", Split("offload"), fraction=0.25, prefill_chunk=16,
                                  options={"decay": d, "prior": prior, **rest}))
        misses += r.total.misses
        seconds += charge(r.log, call_meta(h, 16), load_model_card("mixtral-8x7b"), load_hardware("rtx5090-ryzen"),
                          CostOptions(double_buffer=False)).seconds.sum()
    row = got[labels[len(variants(4)) - 1]]
    assert row["misses"] == misses and row["prefetched"] == 0
    assert row["ms_per_token"] == pytest.approx(1e3 * seconds / trace.num_tokens)
    main = {r["policy"]: r for r in rows if r["variant"] == "main"}
    # copy-bound: fewer transfers, less time (Belady against lru)
    assert main["belady"]["transfers"] < main["lru"]["transfers"]
    assert main["belady"]["ms_per_token"] < main["lru"]["ms_per_token"]
