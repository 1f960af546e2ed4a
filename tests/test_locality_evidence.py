"""The routing localities a published Qwen3.5-122B-A10B decode run allows (sim/locality_evidence.py): the hit-rate
floor its hot-expert cache's speed-up implies, derived by hand, and the same cache replayed on each locality."""

import pytest

from freetoken.sim import anchors, locality_evidence
from freetoken.sim.band import ROUTINGS
from freetoken.sim.model_card import load_model_card


@pytest.fixture(scope="module")
def rates():
    return locality_evidence.evidence(load_model_card(anchors.MODEL))


def test_hit_floor_by_hand():
    # mean of the three runs: 1 / 15.6533 s per token all-CPU, 1 / 22.6667 with the cache
    t_cpu, t_hot = 3 / (15.60 + 15.67 + 15.69), 3 / (22.26 + 22.97 + 22.77)
    assert locality_evidence.hit_floor() == pytest.approx(1 - t_hot / t_cpu, rel=1e-12)
    assert locality_evidence.hit_floor() == pytest.approx(0.3094, abs=1e-4)


def test_uniform_routing_hits_the_cache_share(rates):
    # independent reference: under uniform routing any cache of 44 of 256 experts per layer hits 44 / 256 of the time
    assert rates["uniform"] == pytest.approx(44 / 256, abs=0.01)


def test_published_run_allows_the_pinned_locality_and_rules_out_the_low_ones(rates):
    floor = locality_evidence.hit_floor()
    assert set(rates) == set(ROUTINGS)
    assert rates["pinned"] >= floor and rates["granite decode"] >= floor
    assert rates["mixtral"] < floor and rates["uniform"] < floor
