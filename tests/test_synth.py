"""Synthetic traces: the sampler matches the probabilities it claims, reuse does what it says, and a trace fitted
to a real one has that trace's statistics."""

from dataclasses import replace

import numpy as np
import pytest

from freetoken.trace.importers import import_trace
from freetoken.trace.stats import expert_counts, gini, popularity_skew
from freetoken.sim.reuse import reuse_stats
from freetoken.sim.synth import SynthSpec, fit_spec, synthesize


def test_deterministic_from_the_seed_and_shaped_as_asked():
    spec = SynthSpec(5, 16, 3, 103, num_requests=4, prefill_share=0.25, skew=0.7, reuse=0.4, window=3, seed=7)
    a, b, c = synthesize(spec), synthesize(spec), synthesize(replace(spec, seed=8))
    assert np.array_equal(a.experts, b.experts) and not np.array_equal(a.experts, c.experts)
    assert a.experts.shape == (103, 5, 3) and a.num_experts == 16
    assert np.bincount(a.request).tolist() == [26, 26, 26, 25]  # 103 = 3 * 26 + 25
    for r, n_prefill, n in [(0, 7, 26), (1, 7, 26), (2, 7, 26), (3, 6, 25)]:  # n / 4 rounded half up
        assert a.phase[a.request == r].tolist() == [0] * n_prefill + [1] * (n - n_prefill)
    s = np.sort(a.experts, axis=2)
    assert (s[:, :, 1:] != s[:, :, :-1]).all()  # distinct within each top-k (RoutingTrace validates too)


def _zipf(s, E):
    w = np.arange(1, E + 1, dtype=float) ** -s
    return w / w.sum()


def test_top1_picks_follow_the_zipf_law():
    E, s, T = 10, 1.2, 40000
    trace = synthesize(SynthSpec(2, E, 1, T, num_requests=40, skew=s, reuse=0.0))
    for layer in range(2):
        share = np.sort(expert_counts(trace)[layer])[::-1] / T
        assert np.abs(share - _zipf(s, E)).max() < 0.01  # 4 sigma of a 40k-sample share is < 0.01


def test_top2_inclusion_matches_sampling_without_replacement():
    """P(expert in top-2) = p_e + sum_f p_f * p_e / (1 - p_f), enumerated by hand."""
    E, s, T = 6, 1.0, 40000
    p = _zipf(s, E)
    incl = np.array([p[e] + sum(p[f] * p[e] / (1 - p[f]) for f in range(E) if f != e) for e in range(E)])
    trace = synthesize(SynthSpec(1, E, 2, T, num_requests=40, skew=s, reuse=0.0))
    share = np.sort(expert_counts(trace)[0])[::-1] / T
    assert np.abs(share - incl).max() < 0.012


def test_each_layer_has_its_own_hot_experts():
    trace = synthesize(SynthSpec(12, 32, 2, 2000, skew=2.0, reuse=0.0))
    hottest = expert_counts(trace).argmax(axis=1)
    assert len(set(hottest.tolist())) > 6  # 12 independent permutations of 32 experts rarely collide


def test_full_reuse_with_window_one_copies_from_the_previous_token():
    """reuse=1, window=1: each of K slots copies a uniform slot of the previous token, so the expected number of
    distinct copies is K * (1 - (1 - 1/K)^K) (2.0 -> 1.5 for K=2; 4 -> 2.734 for K=4)."""
    K = 4
    trace = synthesize(SynthSpec(3, 64, K, 6000, num_requests=2, skew=0.0, reuse=1.0, window=1))
    ex = trace.experts
    same_req = trace.request[1:] == trace.request[:-1]
    overlap = np.array([[len(set(a[l]) & set(b[l])) for l in range(3)] for a, b in zip(ex[1:], ex[:-1])])
    mean = overlap[same_req].mean()
    assert abs(mean - K * (1 - (1 - 1 / K) ** K)) < 0.03
    indep = synthesize(SynthSpec(3, 64, K, 6000, num_requests=2, skew=0.0, reuse=0.0))
    ov0 = np.array([[len(set(a[l]) & set(b[l])) for l in range(3)] for a, b in zip(indep.experts[1:],
                                                                                    indep.experts[:-1])])
    assert abs(ov0[same_req].mean() - K * K / 64) < 0.03  # independent uniform picks


def test_more_reuse_means_shorter_reuse_distances():
    base = SynthSpec(8, 32, 2, 3000, num_requests=2, skew=0.5, window=2)
    p50 = [reuse_stats(synthesize(replace(base, reuse=r))).percentiles[50] for r in (0.0, 0.4, 0.8)]
    assert p50[0] > p50[1] > p50[2]


@pytest.mark.parametrize("kwargs, message", [
    ({"top_k": 9}, "top_k 9 exceeds num_experts 8"),
    ({"skew": (1.0, 2.0)}, "skew gives 2 per-layer exponents for 4 layers"),
    ({"reuse": 1.5}, "reuse must lie in [0, 1]"),
    ({"num_tokens": 0}, "num_tokens must be a positive integer"),
    ({"num_requests": 200}, "num_requests 200 exceeds num_tokens 100"),
    ({"skew": -1.0}, "skew exponents must lie in [0, 10.0]"),
    ({"skew": float("nan")}, "skew exponents must lie in [0, 10.0]"),
])
def test_spec_is_validated(kwargs, message):
    args = dict(num_layers=4, num_experts=8, top_k=2, num_tokens=100)
    args.update(kwargs)
    with pytest.raises(ValueError) as e:
        SynthSpec(**args)
    assert message in str(e.value)


# fit (tolerances: mean per-layer Gini within 0.02, mean top-25% share within 0.03, token-granular reuse
# distance p50 and p90 within 10%; an unfitted default spec of the same shape misses them)
def _close(real, syn) -> dict:
    a, b = popularity_skew(real), popularity_skew(syn)
    ra, rb = reuse_stats(real), reuse_stats(syn)
    return {
        "gini": abs(a.gini.mean() - b.gini.mean()) <= 0.02,
        "top25": abs(a.top25.mean() - b.top25.mean()) <= 0.03,
        **{f"p{q}": abs(rb.percentiles[q] / ra.percentiles[q] - 1) <= 0.10 for q in (50, 90)},
    }


@pytest.mark.slow
def test_fitted_trace_has_the_real_traces_statistics(shared_traces):
    real = import_trace(shared_traces / "mixtral-8x7b" / "gsm8k_2_routing.jsonl")
    spec = fit_spec(real)
    assert (spec.num_layers, spec.num_experts, spec.top_k, spec.num_tokens) == (32, 8, 2, 244)
    assert all(_close(real, synthesize(spec)).values()), _close(real, synthesize(spec))
    default = SynthSpec(32, 8, 2, 244, num_requests=2, prefill_share=1.0)
    assert not all(_close(real, synthesize(default)).values())


@pytest.mark.slow
def test_fitted_skew_tracks_each_layer(shared_traces):
    real = import_trace(shared_traces / "granite-3.0-1b-a400m" / "moe_expert_trace.json")
    syn = synthesize(fit_spec(real))
    g_real, g_syn = gini(expert_counts(real)), gini(expert_counts(syn))
    assert np.corrcoef(g_real, g_syn)[0, 1] > 0.7  # the hot layers of the real trace are the hot synthetic ones
