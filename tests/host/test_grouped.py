"""Prefill-sized dense expert calls through torch's grouped GEMM: the fp32 reference within the weights' dtype rounding
(biases, a take mask and skipped picks included), and the shared-expert op taking that route."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.host import grouped, ops
from freetoken.host.kernels import moe_ref

pytestmark = pytest.mark.skipif(not grouped.available(), reason="this torch has no _grouped_mm")


def _rel(a, b):
    return ((a.float() - b).abs().max() / b.abs().max()).item()


def test_grouped_experts_equal_the_fp32_reference_with_biases_a_take_mask_and_skipped_picks():
    gen = torch.Generator().manual_seed(0)
    E, I, D, T, K = 5, 32, 64, 150, 2
    gu, dn = (torch.randn(E, 2 * I, D, generator=gen) / 8).bfloat16(), (torch.randn(E, D, I, generator=gen) / 8).bfloat16()
    bgu, bd = (torch.randn(E, 2 * I, generator=gen) / 4).bfloat16(), (torch.randn(E, D, generator=gen) / 4).bfloat16()
    x = torch.randn(T, D, generator=gen).bfloat16()
    ids = np.stack([torch.randperm(E, generator=gen)[:K].numpy() for _ in range(T)]).astype(np.int32)
    ids[::7, 1] = -1  # a pick another lane computes
    take = np.array([1, 1, 0, 1, 1], np.uint8)
    w = torch.rand(T, K, generator=gen)
    ref = moe_ref(x, torch.from_numpy(ids), w, torch.from_numpy(take), gu[:, :I].float(), gu[:, I:].float(),
                  dn.float(), bgu, bd)
    out = grouped.grouped_experts(x, ids, w, gu, dn, take, bgu, bd, dict(glu="silu"))
    assert out.dtype == torch.float32 and _rel(out, ref) < 1e-2


def test_the_shared_expert_op_of_a_long_prompt_takes_the_gemm_and_keeps_its_result():
    gen = torch.Generator().manual_seed(1)
    I, D, T = 48, 64, 256
    gu, dn = (torch.randn(1, 2 * I, D, generator=gen) / 8).bfloat16(), (torch.randn(1, D, I, generator=gen) / 8).bfloat16()
    x = torch.randn(T, D, generator=gen).bfloat16()
    slot0, scale = torch.zeros(T, 1, dtype=torch.int32), torch.rand(T, 1, generator=gen)
    assert grouped.gemm_sized(slot0.numpy(), None, 1)
    ref = moe_ref(x, slot0, scale, torch.ones(1, dtype=torch.uint8), gu[:, :I].float(), gu[:, I:].float(), dn.float())
    assert _rel(ops.expert_ffn(x, slot0, scale, gu, dn), ref) < 1e-2
