"""Popularity and reuse statistics against values worked out by hand and a brute-force loop."""

import numpy as np

from freetoken.placement.stream import key_stream
from freetoken.trace import RoutingTrace
from freetoken.trace.stats import expert_counts, gini, normalized_entropy, top_share
from freetoken.sim.reuse import access_keys, reuse_distances, reuse_stats, token_reuse_distances
from freetoken.sim.calls import trace_calls


def test_skew_measures_by_hand():
    counts = np.array([[5, 5, 5, 5], [0, 0, 0, 8], [1, 2, 3, 4]])
    assert np.allclose(gini(counts), [0.0, 0.75, 0.25])  # G = sum_ij |xi - xj| / (2 n^2 mean): 20 / 80 = 0.25
    assert np.allclose(top_share(counts, 0.25), [0.25, 1.0, 0.4])
    assert np.allclose(top_share(counts, 0.5), [0.5, 1.0, 0.7])
    h = -(np.array([1, 2, 3, 4]) / 10 * np.log(np.array([1, 2, 3, 4]) / 10)).sum()
    assert np.allclose(normalized_entropy(counts), [1.0, 0.0, h / np.log(4)])


def test_reuse_distance_by_hand():
    keys = np.array([7, 3, 7, 9, 3, 7])  # a b a c b a
    assert reuse_distances(keys).tolist() == [-1, -1, 1, -1, 2, 2]


def test_reuse_distance_matches_a_brute_force_loop():
    keys = np.random.default_rng(1).integers(0, 30, 3000)
    last, want = {}, []
    for i, k in enumerate(keys.tolist()):
        want.append(i - last[k] - 1 if k in last else -1)
        last[k] = i
    assert reuse_distances(keys).tolist() == want


def _trace():
    rng = np.random.default_rng(2)
    ex = np.argsort(rng.random((40, 3, 6)), axis=2)[:, :, :2].astype(np.int16)
    return RoutingTrace(ex, 6, request=np.repeat(np.arange(2, dtype=np.int32), 20),
                        phase=np.tile(np.array([0] * 8 + [1] * 12, np.int8), 2))


def test_token_granular_keys_equal_the_simulators_calls_with_chunk_one():
    t = _trace()
    assert np.array_equal(access_keys(t, 1), key_stream(trace_calls(t, 1), t.num_experts).keys)
    assert np.array_equal(access_keys(t, 4), key_stream(trace_calls(t, 4), t.num_experts).keys)


def test_reuse_stats_percentiles_and_cold_share():
    t = _trace()
    d = reuse_distances(access_keys(t))
    r = reuse_stats(t)
    assert r.accesses == 40 * 3 * 2 and r.cold_share == (d < 0).mean()
    assert (d < 0).sum() == len(np.unique(access_keys(t)))  # one cold access per key ever used
    assert r.percentiles[90] == np.percentile(d[d >= 0], 90)
    assert expert_counts(t).sum() == 40 * 3 * 2


def test_per_layer_token_distances_equal_the_global_stream():
    t = _trace()
    assert np.array_equal(token_reuse_distances(t), reuse_distances(access_keys(t, 1)))
