"""Prefill-sized dense expert calls through torch's grouped GEMM: the fp32 reference within the weights' dtype rounding
(biases, a take mask and skipped picks included), and the shared-expert op taking that route."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.host import grouped, ops
from freetoken.host.kernels import moe_ref

pytestmark = pytest.mark.skipif(not grouped.available(), reason="this torch has no _grouped_mm")


def _experts(gen, E, I, D):
    """bf16 gate_up [E, 2I, D] and down [E, D, I]."""
    return (torch.randn(E, 2 * I, D, generator=gen) / 8).bfloat16(), (torch.randn(E, D, I, generator=gen) / 8).bfloat16()


def _rel(a, b):
    return ((a.float() - b).abs().max() / b.abs().max()).item()


def test_grouped_experts_equal_the_fp32_reference_with_biases_a_take_mask_and_skipped_picks():
    gen = torch.Generator().manual_seed(0)
    E, I, D, T, K = 5, 32, 64, 150, 2
    gu, dn = _experts(gen, E, I, D)
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


@pytest.mark.parametrize("half_fast", [True, False])  # torch's bf16 GEMM at GEMM speed; a slow fallback (AVX2)
def test_the_shared_expert_op_of_a_long_prompt_takes_the_gemm_and_keeps_its_result(half_fast, monkeypatch):
    monkeypatch.setattr(grouped, "_HALF_FAST", [half_fast])
    gen = torch.Generator().manual_seed(1)
    I, D, T = 48, 64, 256
    gu, dn = _experts(gen, 1, I, D)
    x = torch.randn(T, D, generator=gen).bfloat16()
    slot0, scale = torch.zeros(T, 1, dtype=torch.int32), torch.rand(T, 1, generator=gen)
    assert grouped.gemm_sized(slot0.numpy(), None, 1, torch.bfloat16) == half_fast  # else the C kernels take it
    assert grouped.gemm_sized(slot0.numpy(), None, 1, torch.float32)  # torch's fp32 GEMM: fast on every CPU
    ref = moe_ref(x, slot0, scale, torch.ones(1, dtype=torch.uint8), gu[:, :I].float(), gu[:, I:].float(), dn.float())
    assert _rel(ops.expert_ffn(x, slot0, scale, gu, dn), ref) < 1e-2


def test_padded_rows_repeat_each_experts_first_pair_up_to_the_multiple(monkeypatch):
    monkeypatch.setattr(grouped, "ROW_MULTIPLE", 4)
    order, experts = np.array([5, 7, 2, 9, 4]), np.array([0, 0, 1, 1, 1])
    rows, real, ends = grouped.padded_rows(order, experts, 3)  # expert 2 has no pair
    assert rows.tolist() == [5, 7, 5, 5, 2, 9, 4, 2] and real.tolist() == [0, 1, 4, 5, 6]
    assert ends.tolist() == [4, 8, 8]
    assert [len(a) for a in grouped.padded_rows(order[:0], experts[:0], 3)] == [0, 0, 3]


def test_every_gemm_group_is_a_multiple_of_the_row_multiple_and_the_padding_adds_nothing(monkeypatch):
    gen = torch.Generator().manual_seed(2)
    E, I, D, T, K = 6, 32, 64, 90, 2
    gu, dn = _experts(gen, E, I, D)
    x = torch.randn(T, D, generator=gen).bfloat16()
    ids = np.stack([torch.randperm(E, generator=gen)[:K].numpy() for _ in range(T)]).astype(np.int32)
    w = torch.rand(T, K, generator=gen)
    ref = moe_ref(x, torch.from_numpy(ids), w, torch.ones(E, dtype=torch.uint8), gu[:, :I].float(), gu[:, I:].float(),
                  dn.float())
    seen, gmm = [], torch._grouped_mm
    monkeypatch.setattr(torch, "_grouped_mm", lambda a, b, offs: seen.append(offs.clone()) or gmm(a, b, offs=offs))
    out = grouped.grouped_experts(x, ids, w, gu, dn)
    sizes = np.diff(seen[0].numpy(), prepend=0)
    counts = np.bincount(ids.ravel(), minlength=E)
    assert (sizes % grouped.ROW_MULTIPLE == 0).all() and (sizes >= counts).all() and (sizes - counts).max() > 0
    assert _rel(out, ref) < 1e-2
    monkeypatch.setattr(grouped, "ROW_MULTIPLE", 1)
    assert _rel(grouped.grouped_experts(x, ids, w, gu, dn), out) < 1e-3  # unpadded: the same sums
