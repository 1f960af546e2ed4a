"""gather_pairs: two expert tensors per launch (rows of different lengths and dtypes) = the reference gather of each."""

from __future__ import annotations

import torch

from freetoken.kernels.expert_gather import gather_experts_ref, gather_pairs


def test_gather_pairs_equals_reference_per_tensor():
    g = torch.Generator().manual_seed(0)
    E, S = 6, 5
    srcs = [(torch.randn(E, 3, 40, generator=g) * 50).to(torch.bfloat16), torch.randn(E, 7, generator=g),
            (torch.rand(E, 130, generator=g) * 255).to(torch.uint8)]  # a pair of unequal rows, then one alone
    copy_expert = torch.tensor([4, 0, 2, 5], dtype=torch.int32)
    copy_slot = torch.tensor([1, 3, 0, 2], dtype=torch.int32)  # entry 3 is past the count: never copied
    counts = torch.tensor([3, 0, 4])
    got = [torch.zeros((S,) + s.shape[1:], dtype=s.dtype) for s in srcs]
    want = [torch.zeros_like(t) for t in got]
    assert gather_pairs(list(zip(srcs, got)), copy_expert, copy_slot, counts, block=64) == 2
    for src, w in zip(srcs, want):
        gather_experts_ref(src, w, copy_expert, copy_slot, counts)
    for a, b in zip(got, want):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert not got[1][2].any() and not got[1][4].any()
