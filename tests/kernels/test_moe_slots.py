"""moe_slots (one launch: staging rows, slot ids per pick, the call's counters) against its torch reference, on real
device decisions (lru, offload with and without prefill admission, hybrid), interpreted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.engine.device_moe import call_union
from freetoken.engine.device_placement import DevicePolicy
from freetoken.kernels.moe_slots import moe_slots, moe_slots_ref
from freetoken.placement import DECODE, PREFILL, Split, make_policy

L, E, K = 2, 8, 2
SPLITS = {"offload": Split("offload"), "no-admit": Split("offload", admit_prefill=False),
          "hybrid": Split("hybrid", bp=2.0, bh=1.0)}


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_moe_slots_equals_reference(split):
    g = np.random.default_rng(0)
    dev = DevicePolicy(make_policy("lru", capacity=5, num_layers=L, num_experts=E))
    totals, totals_ref = torch.zeros((2, 7), dtype=torch.int64), torch.zeros((2, 7), dtype=torch.int64)
    seen = {"hit": 0, "fetch": 0, "cpu": 0, "staged": 0}
    for step in range(12):
        T = 3 if step < 4 else 1  # prefill calls, then decode
        phase = PREFILL if step < 4 else DECODE
        ids = torch.from_numpy(np.stack([g.choice(E, K, replace=False) for _ in range(T)])).to(torch.int32)
        experts, tokens = call_union(ids, E)
        kind, slot, copy_expert, copy_slot, _evict, counts = dev.decide(step % L, experts, tokens, SPLITS[split],
                                                                        phase)
        copy_ref = copy_slot.clone()
        back, back_ref = (torch.full((2 * experts.numel() + ids.numel(),), -7, dtype=torch.int32) for _ in range(2))
        got = moe_slots(ids, experts, kind, slot, copy_expert, copy_slot, counts, totals, 5, phase, back)
        want = moe_slots_ref(ids, experts, kind, slot, copy_expert, copy_ref, counts, totals_ref, 5, phase, back_ref)
        assert back.tolist() == back_ref.tolist()
        for a, b in zip(got, want):
            assert a.tolist() == b.tolist()
        assert copy_slot.tolist() == copy_ref.tolist() and totals.tolist() == totals_ref.tolist()
        seen["hit"] += int((kind == 0).sum())
        seen["fetch"] += int(counts[0])
        seen["cpu"] += int((kind == 2).sum())
        seen["staged"] += int((copy_slot[:int(counts[0])] >= 5).sum())
    assert seen["hit"] > 0 and seen["fetch"] > 0  # not degenerate
    assert (seen["cpu"] > 0) == (split == "hybrid") and (seen["staged"] > 0) == (split == "no-admit")
