"""Device placement (freetoken.kernels.placement, interpreted here) against the host policy, Plan by Plan.

The host side is the interpreted reference class (policies/lru.py, static_layers.py, frequency.py) replayed call by call;
the device side starts from a fresh compiled policy's arrays. Splits cover offload, cpu, hybrid with each rule and
fetch order, fetch_min_pairs and prefill streaming through staging; capacities from 0 to all keys; a synthetic
trace and a real one (the Mixtral token-level slice and Granite prefill + decode). Shapes stay tiny: the
interpreter runs each call's program on CPU tensors.
"""

from __future__ import annotations

import pytest
import torch

from freetoken.placement import Call, Split, make_policy
from freetoken.engine.device_placement import DEVICE_FORMS, DevicePolicy, device_form, placement_line
from freetoken.sim.calls import trace_stream
from freetoken.sim.replay import replay
from tests.test_compiled_policies import SPLITS, build, capacities, real, synthetic

DEVICE_POLICIES = [("lru", {}), ("static_layers", {}), ("frequency", {"scope": "per_layer"}),
                   ("frequency", {"scope": "global"})]


def check(trace, chunk, policy, options, cases, max_calls=None) -> tuple[int, int]:
    """device plan == reference plan, call by call, for each (capacity, split name) in cases (capacity: a number, or a
    slice of capacities()); returns (hits, evictions) seen, so a test knows it was not degenerate."""
    stream = trace_stream(trace, chunk)
    calls = list(stream.calls())[:max_calls]
    hits = evictions = 0
    caps = capacities(trace, stream)
    for capacity, split_name in cases:  # (a slice's start taken around the list: never an empty pick)
        picked = caps[capacity.start % len(caps)::capacity.step] if isinstance(capacity, slice) else [capacity]
        for cap in picked:
            split = SPLITS[split_name]
            ref = replay(calls, build(policy, options, cap, trace, stream, True), split, keep_plans=True)
            dev = DevicePolicy(build(policy, options, cap, trace, stream, False))
            for c, (call, want) in enumerate(zip(calls, ref.plans)):
                got = dev.plan(call, split)
                assert got == want, f"{policy} {options} {split_name} capacity {cap} call {c}: {call}"
                hits += len(want.hits)
                evictions += len(want.evict)
    return hits, evictions


# fast: one small synthetic trace (18 calls), the cases that exercise each branch of the kernel (~0.1 s a call)
FAST = [("lru", {}, [(6, "offload"), (5, "balanced-most_tokens"), (4, "paper-most_recent"),
                     (6, "min_pairs-stream_prefill")]),
        ("static_layers", {}, [(8, "max2-lowest_id")]),
        ("frequency", {"scope": "global"}, [(6, "balanced-most_tokens")])]


@pytest.mark.parametrize("policy, options, cases", FAST, ids=[f"{p}-{len(c)}" for p, _, c in FAST])
def test_synthetic_branches(policy, options, cases):
    hits, evictions = check(synthetic(0, T=12, L=2), 5, policy, options, cases)
    assert hits > 0
    assert (evictions > 0) == (policy == "lru")


@pytest.mark.slow
@pytest.mark.parametrize("policy, options", DEVICE_POLICIES, ids=lambda x: x if isinstance(x, str) else
                         "-".join(str(v) for v in x.values()) or "-")
def test_synthetic_every_split_and_capacity(policy, options):
    """Each split at every third capacity from its own offset: every split and every capacity at least once (the
    kernel's branches do not cross-multiply; the fast tests above take each of them)."""
    cases = [(slice(i, None, 3), s) for i, s in enumerate(SPLITS)]
    hits, evictions = check(synthetic(0, T=20, L=3), 5, policy, options, cases)
    assert hits > 0
    assert (evictions > 0) == (policy == "lru")


@pytest.mark.slow
@pytest.mark.parametrize("name, splits", [("mixtral", ["offload", "balanced-most_tokens"]),
                                          ("granite", ["min_pairs-stream_prefill", "max2-lowest_id"])])
@pytest.mark.parametrize("policy, options", DEVICE_POLICIES[:3], ids=lambda x: x if isinstance(x, str) else
                         "-".join(str(v) for v in x.values()) or "-")
def test_real_traces(name, splits, policy, options):
    trace, chunk = real(name)
    cases = [(slice(i, None, 2), s) for i, s in enumerate(splits)]  # between them, every capacity
    hits, _ = check(trace, chunk, policy, options, cases, max_calls=96)
    assert hits > 0


def test_real_trace_lru_fast():
    """Granite's recorded prefill + decode, 40 calls, LRU at half the keys, offload."""
    trace, chunk = real("granite")
    hits, evictions = check(trace, chunk, "lru", {}, [(round(0.5 * trace.num_keys), "offload")], max_calls=40)
    assert hits > 0 and evictions > 0


def test_lru_hand_derived():
    """capacity 2, one layer of 4 experts: [0,1] fills slots 0,1; [2] evicts 0 (least recent) into slot 0;
    hit on 1 then [3] evicts 2, not 1."""
    dev = DevicePolicy(make_policy("lru", 2, 1, 4))
    plans = [dev.plan(Call(0, e, [1] * len(e)), Split()) for e in ([0, 1], [2], [1], [3])]
    assert [(p.fetch, p.fetch_slots, p.evict) for p in plans] == [
        ([0, 1], [0, 1], []), ([2], [0], [(0, 0)]), ([], [], []), ([3], [0], [(0, 2)])]
    assert plans[2].hit_slots == [1]


def test_padding_and_copy_list():
    """Trailing -1 entries are padding (a fixed-width call for a graph); the copy list is the fetches in order."""
    dev = DevicePolicy(make_policy("lru", 3, 2, 4))
    split = Split()
    kind, slot, ce, cs, ev, counts = dev.decide(1, torch.tensor([3, 1, -1, -1], dtype=torch.int32),
                                                torch.tensor([1, 1, 0, 0], dtype=torch.int32), split, 1)
    assert kind.tolist() == [1, 1, -1, -1]
    assert counts.tolist() == [2, 0, 2]
    assert ce[:2].tolist() == [3, 1] and cs[:2].tolist() == [0, 1] and slot[:2].tolist() == [0, 1]
    assert dev.slot(1, 3) == 0 and dev.slot(1, 1) == 1 and dev.state[3].tolist() == [2, 2]


def test_host_path_named():
    assert set(DEVICE_FORMS) == {"lru", "static_layers", "frequency"}
    assert "no device form" in device_form(make_policy("s3fifo", 4, 2, 4))
    assert "interpreted reference" in device_form(make_policy("lru", 4, 2, 4, reference=True))
    pol = make_policy("lru", 4, 2, 4)
    pol.plan(Call(0, [1], [1]), Split())
    assert "already planned" in device_form(pol)
    with pytest.raises(ValueError, match="no device form"):
        DevicePolicy(make_policy("s3fifo", 4, 2, 4))
    assert placement_line(make_policy("s3fifo", 4, 2, 4)) == (
        "placement: s3fifo has no device form (device: lru, static_layers, frequency); it decides on the host")
