"""router_linear_topk (projection + softmax top-k in one launch) against linear_ref + router_topk_ref, interpreted."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels.router_linear import router_linear_topk, router_linear_topk_ref


@pytest.mark.parametrize("T, D, E, k, renormalize, dtype", [(1, 64, 8, 2, True, torch.float32),
                                                            (3, 48, 128, 8, True, torch.float32),
                                                            (2, 64, 16, 4, False, torch.float32),
                                                            (1, 64, 8, 2, True, torch.bfloat16),
                                                            # split over programs: 4 x 2 tiles, 2 x 4 tiles
                                                            (1, 512, 128, 8, True, torch.float32),
                                                            (2, 1000, 64, 4, False, torch.float32),
                                                            (9, 512, 128, 8, True, torch.float32)])
def test_router_linear_topk_equals_composition(T, D, E, k, renormalize, dtype):
    g = torch.Generator().manual_seed(E + k)
    h = torch.randn(T, D, generator=g).to(dtype)
    w = (torch.randn(E, D, generator=g) / D ** 0.5).to(dtype)
    want_w, want_ids = router_linear_topk_ref(h, w, k, renormalize)
    for _ in range(2):  # a split launch leaves its counters at zero for the next one
        weights, ids = router_linear_topk(h, w, k, renormalize)
        assert ids.tolist() == want_ids.tolist()
        torch.testing.assert_close(weights, want_w, rtol=1e-5, atol=1e-6)


def test_decode_sizes_split_the_features():
    """The kernel's split: one program per BLOCK_D tile up to a wave (4 programs stand for it on CPU), one for
    prefill-sized T."""
    from freetoken.kernels.router_linear import router_splits

    cpu = torch.device("cpu")
    assert router_splits(1, 512, 64, cpu) == 4 and router_splits(2, 1000, 128, cpu) == 2
    assert router_splits(1, 64, 64, cpu) == 1 and router_splits(9, 4096, 64, cpu) == 1
