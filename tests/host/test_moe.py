"""The host MoE kernel against torch (moe_ref on the formats' own dequantized weights), on both of its paths: this
CPU's (AVX512-BF16 dot products on the packed bits where the CPU has them) and the portable one; and the invariants
the engine leans on: a token's result does not depend on its batch-mates or on the thread count (bitwise)."""

from __future__ import annotations

import pytest
import torch

from freetoken.host import kernels as hk
from freetoken.host.kernels import MoEMatrices, moe, moe_ref
from freetoken.host.native import packed_matrix
from tests.host import packed_random as pr
from tests.host.conftest import native_or_skip

E, I, D, T, K = 6, 128, 256, 7, 3
# fp32 activations: exact products, fp32 sums; bf16 / fp16: the gated activation rounds to the dtype (as the GPU
# kernel's h buffer does), so a value on a rounding boundary may round the other way: one ulp of h, weighted
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-3, torch.float16: 5e-4}


def _routing(gen):
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)]).int()  # [T, K]
    return ids, torch.rand(T, K, generator=gen)


def _check(out, ref, dtype):
    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    assert err < TOL[dtype], err


@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dense_experts_equal_torch(dtype, generic):
    native_or_skip()
    gen = torch.Generator().manual_seed(0)
    gu, dn = (torch.randn(E, 2 * I, D, generator=gen) / 8).to(dtype), (torch.randn(E, D, I, generator=gen) / 8).to(dtype)
    x = torch.randn(T, D, generator=gen).to(dtype)
    ids, w = _routing(gen)
    take = torch.tensor([1, 1, 0, 1, 1, 1], dtype=torch.uint8)
    ref = moe_ref(x, ids, w, take, gu[:, :I].float(), gu[:, I:].float(), dn.float())
    _check(moe(MoEMatrices.dense(gu, dn), x, ids, w, take, generic=generic), ref, dtype)


@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_more_tokens_per_expert_than_one_pass_takes(dtype, generic):
    """Dense rows meet an expert's tokens a chunk at a time (ftk.h ft_tokens_per_pass: 3 tokens at a hidden size of
    2,048, 6 at 1,024): with 16 tokens on each expert, every token's result equals the reference, and bitwise its
    result in a call of its own."""
    native_or_skip()
    gen = torch.Generator().manual_seed(5)
    E2, I2, D2, T2 = 2, 1024, 2048, 16
    gu = (torch.randn(E2, 2 * I2, D2, generator=gen) / 32).to(dtype)
    dn = (torch.randn(E2, D2, I2, generator=gen) / 32).to(dtype)
    x = torch.randn(T2, D2, generator=gen).to(dtype)
    ids, w = torch.tensor([[0, 1]] * T2, dtype=torch.int32), torch.rand(T2, 2, generator=gen)
    m = MoEMatrices.dense(gu, dn)
    batch = moe(m, x, ids, w, None, generic=generic)
    solo = torch.cat([moe(m, x[t:t + 1], ids[t:t + 1], w[t:t + 1], None, generic=generic) for t in range(T2)])
    assert torch.equal(batch, solo)
    _check(batch, moe_ref(x, ids, w, torch.ones(E2, dtype=torch.uint8), gu[:, :I2].float(), gu[:, I2:].float(),
                          dn.float()), dtype)


def test_packed_rows_meet_more_tokens_than_one_pass_takes():
    """int4 rows against int8 activations take the tokens a chunk at a time too (ft_tokens_per_pass: 12 at a hidden
    size of 2,048): 16 tokens on each expert give the reference on the dequantized weights and, bitwise, each token's
    result in a call of its own."""
    native_or_skip()
    gen = torch.Generator().manual_seed(6)
    E2, I2, D2, T2 = 2, 256, 2048, 16
    gate, up, down = pr.make("int4-g128", E2, I2, D2, gen), pr.make("int4-g128", E2, I2, D2, gen), \
        pr.make("int4-g128", E2, D2, I2, gen)
    x = torch.randn(T2, D2, generator=gen).bfloat16()
    ids, w = torch.tensor([[0, 1]] * T2, dtype=torch.int32), torch.rand(T2, 2, generator=gen)
    m = MoEMatrices(packed_matrix(gate), packed_matrix(up), packed_matrix(down), E2, keep=(gate, up, down))
    batch = moe(m, x, ids, w, None)
    solo = torch.cat([moe(m, x[t:t + 1], ids[t:t + 1], w[t:t + 1], None) for t in range(T2)])
    assert torch.equal(batch, solo)
    units = (hk.int8_acts_unit(gate), hk.int8_acts_unit(down)) if hk.int8_acts() else (None, None)
    _check(batch, moe_ref(x, ids, w, torch.ones(E2, dtype=torch.uint8), pr.dequantized(gate), pr.dequantized(up),
                          pr.dequantized(down), units=units), torch.bfloat16)


@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", pr.FORMATS)
def test_packed_experts_equal_torch_on_the_dequantized_weights(fmt, dtype, generic, monkeypatch):
    native_or_skip()
    gen = torch.Generator().manual_seed(1)
    Dd = 320 if fmt.startswith("int4-g64") else D  # a partial last 128-column chunk
    gate, up, down = pr.make(fmt, E, I, Dd, gen), pr.make(fmt, E, I, Dd, gen), pr.make(fmt, E, Dd, I, gen)
    x = torch.randn(T, Dd, generator=gen).to(dtype)
    ids, w = _routing(gen)
    take = torch.ones(E, dtype=torch.uint8)
    units = (None, None) if generic or dtype != torch.bfloat16 else (hk.int8_acts_unit(gate), hk.int8_acts_unit(down))
    ref = moe_ref(x, ids, w, take, pr.dequantized(gate), pr.dequantized(up), pr.dequantized(down), units=units)
    m = MoEMatrices(packed_matrix(gate), packed_matrix(up), packed_matrix(down), E, keep=(gate, up, down))
    _check(moe(m, x, ids, w, take, generic=generic), ref, dtype)


@pytest.mark.parametrize("glu", ["clamped", "silu_limit"])
def test_biases_and_the_clamped_activation(glu):
    native_or_skip()
    gen = torch.Generator().manual_seed(2)
    gu, dn = torch.randn(E, 2 * I, D, generator=gen) / 4, torch.randn(E, D, I, generator=gen) / 4
    bgu, bd = torch.randn(E, 2 * I, generator=gen), torch.randn(E, D, generator=gen)
    x = torch.randn(T, D, generator=gen)
    ids, w = _routing(gen)
    take = torch.ones(E, dtype=torch.uint8)
    opts = dict(glu=glu, alpha=1.702, limit=1.5 if glu == "silu_limit" else 7.0)
    ref = moe_ref(x, ids, w, take, gu[:, :I], gu[:, I:], dn, bgu, bd, **opts)
    for generic in (False, True):
        m = MoEMatrices.dense(gu, dn, b_gate_up=bgu, b_down=bd, **opts)
        _check(moe(m, x, ids, w, take, generic=generic), ref, torch.float32)


@pytest.mark.parametrize("fmt", ["bf16", "int4-g128", "mxfp4", "fp8-block"])
def test_a_token_does_not_depend_on_its_batch_or_the_threads(fmt):
    native_or_skip()
    gen = torch.Generator().manual_seed(3)
    I3 = 3 * I  # the down rows' sums over several units: an order that differs shows in the fp32 result
    if fmt == "bf16":
        m = MoEMatrices.dense(torch.randn(E, 2 * I3, D, generator=gen).bfloat16(),
                              torch.randn(E, D, I3, generator=gen).bfloat16())
    else:
        ws = [pr.make(fmt, E, I3, D, gen), pr.make(fmt, E, I3, D, gen), pr.make(fmt, E, D, I3, gen)]
        m = MoEMatrices(*(packed_matrix(w) for w in ws), E, keep=tuple(ws))
    x = torch.randn(T, D, generator=gen).bfloat16()
    ids, w = _routing(gen)
    hk.set_threads(1)
    batch = moe(m, x, ids, w, None)
    solo = torch.cat([moe(m, x[t:t + 1], ids[t:t + 1], w[t:t + 1], None) for t in range(T)])  # (one token: whole
    hk.set_threads(2)  # matrices a step; seven: FT_ROW_BLOCK rows a step, moe.c's two ways through the rows)
    two = moe(m, x, ids, w, None)
    hk.set_threads(3)  # slices of 42-43 rows: blocks that end mid-way through a tile
    three = torch.cat([moe(m, x[t:t + 1], ids[t:t + 1], w[t:t + 1], None) for t in range(T)])
    assert torch.equal(batch, solo) and torch.equal(batch, two) and torch.equal(batch, three)


def test_take_none_is_every_expert_and_cast_rounds_once():
    native_or_skip()
    gen = torch.Generator().manual_seed(4)
    m = MoEMatrices.dense(torch.randn(E, 2 * I, D, generator=gen).bfloat16(), torch.randn(E, D, I, generator=gen).bfloat16())
    x = torch.randn(T, D, generator=gen).bfloat16()
    ids, w = _routing(gen)
    ids[0, 0] = -1  # not routed: skipped
    full = moe(m, x, ids, w, torch.ones(E, dtype=torch.uint8))
    assert torch.equal(moe(m, x, ids, w, None), full)
    assert torch.equal(moe(m, x, ids, w, None, cast=True), full.bfloat16())
    none = moe(m, x, ids, w, torch.zeros(E, dtype=torch.uint8))
    assert torch.equal(none, torch.zeros_like(none))
