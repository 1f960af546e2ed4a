"""Path Q (int4 weights x int8 activations, AVX512-VNNI or AVX2): the activations' rounding checked by hand through
identity weights, the kernels against the dequantized weights times int8_acts_ref for every unit size, the switch
back to bf16 activations, NaN carried through; in this CPU's build and in the portable build's AVX2 one."""

from __future__ import annotations

import pytest
import torch

from freetoken.host import kernels as hk
from freetoken.host.kernels import MoEMatrices, int8_acts_ref, moe, moe_ref
from freetoken.host.native import packed_matrix
from freetoken.quant.packed import PackedWeight
from tests.host import packed_random as pr
from tests.host.conftest import native_or_skip


BUILDS = [False, hk.AVX2]  # this CPU's own path Q; the portable build's AVX2 one (what CPUs without AVX-512 run)


def _path_q_or_skip(w: PackedWeight, build=False) -> int:
    native_or_skip()
    unit = hk.int8_acts_unit(w, build)
    if unit is None:
        pytest.skip("this CPU (or build) has neither AVX512-VNNI nor AVX2: int4 reads bf16 activations" if not build
                    else "this CPU has no AVX2 (or the portable build no path Q)")
    return unit


def _identity(K: int, group: int) -> PackedWeight:
    """K x K int4 rows with w[n, n] = 1 and 0 elsewhere (q = 9 on the diagonal, 8 off it, zero 8, scale 1)."""
    q = torch.full((K, K), 8, dtype=torch.uint8)
    q.fill_diagonal_(9)
    data = (q[:, 0::2] | (q[:, 1::2] << 4))[None]
    scales = torch.ones(1, K, K // group, dtype=torch.float16)
    zeros = torch.full((1, K, K // group), 8, dtype=torch.uint8)
    return PackedWeight("int4", (K, K), data, scales, zeros=zeros, group=group)


@pytest.mark.parametrize("build", BUILDS)
def test_activations_round_to_even_steps_of_max_over_127(build):
    w = _identity(128, 128)
    _path_q_or_skip(w, build)
    d = 2.0 ** -6  # max |x| = 127 d: every value below is exact in bf16
    x = torch.zeros(1, 128)
    x[0, :6] = torch.tensor([127 * d, -0.5, 1.5 * d, 2.5 * d, -2.5 * d, 0.3 * d])
    want = torch.zeros(1, 128)
    want[0, :6] = torch.tensor([127 * d, -0.5, 2 * d, 2 * d, -2 * d, 0.0])  # ties to even: 1.5 -> 2, 2.5 -> 2
    got = hk.linear(x.bfloat16(), w.select(0), generic=build).float()
    assert torch.equal(got, want)
    assert torch.equal(int8_acts_ref(x, 128), want)


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("group", [16, 32, 64, 128, 256])
def test_linear_equals_int8_acts_ref_times_the_dequantized_weights(group, build):
    gen = torch.Generator().manual_seed(group)
    w = pr.int4(1, 96, 512, group, gen=gen).select(0)
    unit = _path_q_or_skip(w, build)
    assert unit == min(group, 128)
    x = torch.randn(5, 512, generator=gen).bfloat16()
    ref = int8_acts_ref(x, unit) @ w.to_float(0).T
    for rows in (x[:1], x):  # the decode tile (one row) and the batch one
        out = hk.linear(rows, w, generic=build).float()
        err = (out - ref[: len(rows)]).abs() / ref[: len(rows)].abs().clamp_min(ref.abs().max() * 1e-3)
        assert err.max().item() < 2 ** -8  # the output's bf16 rounding


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("group", [32, 128, 256])
def test_moe_equals_its_reference_with_int8_activations_and_bf16_ones_when_switched_off(group, build):
    gen = torch.Generator().manual_seed(5)
    E, I, D, T, K = 5, 128, 256, 6, 2
    gate, up, down = pr.int4(E, I, D, group, gen=gen), pr.int4(E, I, D, group, gen=gen), pr.int4(E, D, I, 128, gen=gen)
    _path_q_or_skip(gate, build)
    m = MoEMatrices(packed_matrix(gate), packed_matrix(up), packed_matrix(down), E, keep=(gate, up, down))
    x = torch.randn(T, D, generator=gen).bfloat16()
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)]).int()
    wts = torch.rand(T, K, generator=gen)
    take = torch.ones(E, dtype=torch.uint8)
    deq = [pr.dequantized(t) for t in (gate, up, down)]
    exact = moe_ref(x, ids, wts, take, *deq)
    quant = moe_ref(x, ids, wts, take, *deq, units=(min(group, 128), 128))

    def rel(a, b):
        return ((a - b).abs().max() / b.abs().max()).item()

    got = moe(m, x, ids, wts, take, generic=build)
    assert rel(got, quant) < 2e-3  # one bf16 ulp of h where it sits on a rounding boundary
    assert 2e-3 < rel(got, exact) < 5e-2  # the int8 rounding itself: visible, and small
    hk.set_int8_acts(False)
    assert rel(moe(m, x, ids, wts, take, generic=build), exact) < 2e-3


@pytest.mark.parametrize("build", BUILDS)
def test_a_nan_activation_makes_nan_outputs(build):
    gen = torch.Generator().manual_seed(9)
    w = pr.int4(1, 32, 256, 128, gen=gen).select(0)
    _path_q_or_skip(w, build)
    x = torch.randn(2, 256, generator=gen).bfloat16()
    x[1, 200] = float("nan")
    out = hk.linear(x, w, generic=build).float()
    assert out[0].isfinite().all() and out[1].isnan().all()


def test_a_bad_switch_value_is_named(monkeypatch):
    monkeypatch.setenv("FT_HOST_INT8_ACTS", "maybe")
    monkeypatch.setattr(hk, "_INT8_ACTS", [None])
    with pytest.raises(ValueError, match="FT_HOST_INT8_ACTS='maybe'"):
        hk.int8_acts()
