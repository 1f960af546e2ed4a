"""The expert gather moves exactly the live entries of a device copy list, byte for byte, in any dtype."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels.expert_gather import gather_experts, gather_experts_ref


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.uint8])
def test_gather_equals_reference(dtype):
    g = torch.Generator().manual_seed(0)
    E, S = 6, 5
    src = (torch.randn(E, 3, 40, generator=g) * 50).to(dtype)  # [E, 3, 40]: rows of 120 elements, 2 blocks of 64
    copy_expert = torch.tensor([4, 0, 2, 5], dtype=torch.int32)
    copy_slot = torch.tensor([1, 3, 0, 2], dtype=torch.int32)  # entry 3 is past the count: never copied
    counts = torch.tensor([3, 0, 4])
    got = torch.zeros(S, 3, 40, dtype=dtype)
    want = torch.zeros(S, 3, 40, dtype=dtype)
    gather_experts(src, got, copy_expert, copy_slot, counts, block=64)
    gather_experts_ref(src, want, copy_expert, copy_slot, counts)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(got[1], src[4]) and torch.equal(got[3], src[0]) and torch.equal(got[0], src[2])
    assert not got[2].any() and not got[4].any()


def test_gather_refuses_mismatched_rows():
    with pytest.raises(ValueError, match="rows differ"):
        gather_experts(torch.zeros(2, 4), torch.zeros(2, 5), torch.zeros(1, dtype=torch.int32),
                       torch.zeros(1, dtype=torch.int32), torch.ones(1, dtype=torch.int64))


@pytest.mark.parametrize("live", [0, 1, 4])
def test_fixed_programs_share_every_block(live):
    """4 programs (the CPU grid) share live x 9 blocks of 32: each loops over every 4th (entry, block) item."""
    g = torch.Generator().manual_seed(live)
    src = torch.randn(5, 280, generator=g)  # 280 = 8 full blocks of 32 + a part block
    copy_expert = torch.tensor([3, 1, 4, 0], dtype=torch.int32)
    copy_slot = torch.tensor([2, 0, 3, 1], dtype=torch.int32)
    counts = torch.tensor([live, 0, 4])
    got, want = torch.zeros(4, 280), torch.zeros(4, 280)
    gather_experts(src, got, copy_expert, copy_slot, counts, block=32)
    gather_experts_ref(src, want, copy_expert, copy_slot, counts)
    assert torch.equal(got, want) and int((got != 0).any(-1).sum()) == live
