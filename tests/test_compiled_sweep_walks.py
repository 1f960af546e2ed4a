"""The compiled sweeps' victim walk (heap read in place through a frontier, the scan resumed across a call's
evictions, the heap settled when the next call begins) against the Python reference, Plan by Plan, where it is
stressed most: a hint as deep as the sweep (the loose walk bound), a scan cap of 1-2 keys (the cap binds and scans
resume after every eviction), hinted prefetches that evict predicted keys, and a longer token-level stream."""

from __future__ import annotations

import numpy as np
import pytest

from freetoken.placement import DECODE
from freetoken.trace import RoutingTrace
from tests.test_compiled_policies import check, real, synthetic

CASES = [("hinted_sweep", {"depth": 3, "accuracy": 0.7, "min_confidence": 0.3}),
         ("hinted_sweep", {"depth": 3, "accuracy": 0.9, "min_confidence": 1.5, "scan": 2}),
         ("lookahead", {"depth": 3, "accuracy": 0.6, "scan": 1}),
         ("layer_sweep", {"scan": 2, "decay": 0.6})]


@pytest.mark.parametrize("policy, options", CASES, ids=lambda x: x if isinstance(x, str) else
                         "-".join(f"{k}{v}" for k, v in x.items()))
def test_synthetic_deep_hints_and_small_scans(policy, options):
    assert check(synthetic(3, T=48), 4, policy, options, ["offload", "paper-most_recent"]) > 0


def test_mixtral_hint_as_deep_as_the_sweep():
    trace, chunk = real("mixtral")
    depth = trace.num_layers - 1  # every later layer of the token hinted: the walk reads far
    assert check(trace, chunk, "hinted_sweep", {"depth": depth, "accuracy": 0.9, "min_confidence": 0.6},
                 ["offload"]) > 0


@pytest.mark.slow
def test_mixtral_longer_stream_small_scan():
    """96 tokens (3,072 calls): residents turn over many times, so settled heaps and resumed scans are exercised."""
    from freetoken.trace.importers import import_trace
    from tests.conftest import shared_traces_dir

    root = shared_traces_dir()
    if root is None:
        pytest.skip("real traces not present (set FT_SHARED_TRACES or place shared/ beside the checkout)")
    tr = import_trace(root / "mixtral-8x7b" / "humaneval_1_routing.jsonl")
    tr = tr.select(np.arange(tr.num_tokens) < 96)
    tr = RoutingTrace(tr.experts, tr.num_experts, request=tr.request, phase=np.full(tr.num_tokens, DECODE, np.int8))
    for policy, options in [("layer_sweep", {"scan": 2}), ("lookahead", {"depth": 2, "scan": 3})]:
        assert check(tr, 1, policy, options, ["offload"]) > 0
