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
@pytest.mark.parametrize("fmt", pr.FORMATS)
def test_packed_experts_equal_torch_on_the_dequantized_weights(fmt, dtype, generic, monkeypatch):
    native_or_skip()
    gen = torch.Generator().manual_seed(1)
    Dd = 320 if fmt.startswith("int4-g64") else D  # a partial last 128-column chunk
    gate, up, down = pr.make(fmt, E, I, Dd, gen), pr.make(fmt, E, I, Dd, gen), pr.make(fmt, E, Dd, I, gen)
    x = torch.randn(T, Dd, generator=gen).to(dtype)
    ids, w = _routing(gen)
    take = torch.ones(E, dtype=torch.uint8)
    ref = moe_ref(x, ids, w, take, pr.dequantized(gate), pr.dequantized(up), pr.dequantized(down))
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
    if fmt == "bf16":
        m = MoEMatrices.dense(torch.randn(E, 2 * I, D, generator=gen).bfloat16(),
                              torch.randn(E, D, I, generator=gen).bfloat16())
    else:
        ws = [pr.make(fmt, E, I, D, gen), pr.make(fmt, E, I, D, gen), pr.make(fmt, E, D, I, gen)]
        m = MoEMatrices(*(packed_matrix(w) for w in ws), E, keep=tuple(ws))
    x = torch.randn(T, D, generator=gen).bfloat16()
    ids, w = _routing(gen)
    for act8 in ((False, True) if fmt.startswith("int4") else (False,)):
        hk.set_int8_activations(act8)
        hk.set_threads(1)
        batch = moe(m, x, ids, w, None)
        solo = torch.cat([moe(m, x[t:t + 1], ids[t:t + 1], w[t:t + 1], None) for t in range(T)])
        hk.set_threads(2)
        two = moe(m, x, ids, w, None)
        assert torch.equal(batch, solo) and torch.equal(batch, two)


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


def _q8(v: torch.Tensor) -> torch.Tensor:
    """[n, K] -> the values path A8 multiplies: per 32-column block, scale max|x| / 127, round to nearest."""
    b = v.float().view(v.shape[0], -1, 32)
    s = b.abs().amax(-1, keepdim=True) / 127
    return (torch.where(s > 0, (b / s).round(), 0) * s).view(v.shape)


def _act8_or_skip():
    native_or_skip()
    if not hk.path_a():
        pytest.skip("this CPU has no AVX512-BF16 / VNNI path")


@pytest.mark.parametrize("fmt", ["int4-g128", "int4-g32"])
def test_int8_activations_equal_the_quantized_product(fmt):
    """Path A8 (VNNI) computes exactly sum_k w_k * x^_k with x^ the activations quantized per 32-column block:
    one projection against that product in torch, to fp32 summation order."""
    _act8_or_skip()
    gen = torch.Generator().manual_seed(5)
    w = pr.make(fmt, 1, 384, 512, gen)
    x = torch.randn(3, 512, generator=gen).bfloat16()
    hk.set_int8_activations(True)
    out = hk.linear(x, w.select(0)).float()
    ref = (_q8(x) @ w.to_float(0).T)
    assert ((out - ref).abs().max() / ref.abs().max()).item() < 8e-3  # only the output's bf16 rounding
    exact = (x.float() @ w.to_float(0).T)
    assert 1e-3 < ((out - exact).abs().max() / exact.abs().max()).item() < 3e-2  # it did quantize, by ~1/254


def test_int8_activations_moe_stays_within_the_quantization_error():
    _act8_or_skip()
    gen = torch.Generator().manual_seed(6)
    gate, up, down = (pr.make("int4-g128", E, I, D, gen), pr.make("int4-g128", E, I, D, gen),
                      pr.make("int4-g128", E, D, I, gen))
    m = MoEMatrices(*(packed_matrix(w) for w in (gate, up, down)), E, keep=(gate, up, down))
    x = torch.randn(T, D, generator=gen).bfloat16()
    ids, w = _routing(gen)
    hk.set_int8_activations(True)
    out = moe(m, x, ids, w, None)
    from freetoken.kernels.expert_ffn import glu_ref

    G, U, W2 = pr.dequantized(gate), pr.dequantized(up), pr.dequantized(down)
    ref = torch.zeros(T, D)
    for t in range(T):
        xq = _q8(x[t:t + 1])[0]
        for k in range(K):
            e = int(ids[t, k])
            h = glu_ref(G[e] @ xq, U[e] @ xq).bfloat16()
            ref[t] += w[t, k] * (W2[e] @ _q8(h[None])[0])
    assert ((out - ref).abs().max() / ref.abs().max()).item() < 5e-3  # bf16 rounding flips of h, amplified
