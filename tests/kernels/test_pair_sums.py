"""The expert FFNs' last launch with terms folded in (pair_sums.py): against its torch reference, and a deferred FFN
finished with terms equal to the undeferred FFN followed by the eager adds it replaces, for every kernel set. Bit
equality is asserted in fp32, and in bf16 for the torch sets; Triton's interpreter rounds fp32 -> bf16 otherwise than
torch (and the GPU) do, so interpreted bf16 is held to a few bf16 steps."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels import expert_ffn, expert_ffn_quant
from freetoken.kernels.host import expert_ffn_host, expert_ffn_quant_host
from freetoken.kernels.pair_sums import PairSums, sum_pairs, sum_pairs_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("terms", [0, 1, 2])
def test_sum_pairs_with_terms_is_the_reference(dtype, terms):
    g = torch.Generator().manual_seed(terms)
    T, K, D, splits = 3, 4, 40, 2
    y = torch.randn(splits, T * K, D, generator=g)
    slot_ids = torch.randint(-1, 5, (T, K), generator=g, dtype=torch.int32)
    extra = tuple(torch.randn(T, D, generator=g).to(t) for t in (dtype, torch.float32)[:terms])  # an fp32 one too
    got = sum_pairs(y, slot_ids, torch.empty(T, D, dtype=dtype), extra)
    want = sum_pairs_ref(y, slot_ids, torch.empty(T, D, dtype=dtype), extra)
    assert got.dtype == dtype
    if dtype == torch.float32:
        assert torch.equal(got, want)
    else:  # each of up to three roundings may differ by one bf16 step at the intermediates' size (|.| < 16 here)
        scale = max([float(want.float().abs().max())] + [float(t.float().abs().max()) for t in extra])
        assert scale < 16
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=3 * 16 * 2**-8)


def test_sum_pairs_refuses_a_bad_term():
    y, slots, out = torch.zeros(1, 4, 8), torch.zeros(2, 2, dtype=torch.int32), torch.empty(2, 8)
    with pytest.raises(ValueError, match=r"at most two \[2, 8\] row-major terms"):
        sum_pairs(y, slots, out, (torch.zeros(2, 9),))


def _dense(dtype, g):
    S, D, I = 4, 32, 16
    return (torch.randn(S, 2 * I, D, generator=g) / D**0.5).to(dtype), (torch.randn(S, D, I, generator=g) / I**0.5).to(dtype)


@pytest.mark.parametrize("ffn, dtype", [(expert_ffn, torch.float32), (expert_ffn_host, torch.float32),
                                        (expert_ffn_host, torch.bfloat16)], ids=["triton", "reference", "reference-bf16"])
def test_a_deferred_ffn_finishes_as_the_eager_adds(ffn, dtype):
    g = torch.Generator().manual_seed(3)
    w_gate_up, w_down = _dense(dtype, g)
    T, K, D = 2, 3, w_gate_up.shape[2]
    x = torch.randn(T, D, generator=g).to(dtype)
    slots = torch.tensor([[0, 2, -1], [3, -1, 1]], dtype=torch.int32)
    weights = torch.rand(T, K, generator=g)
    other = torch.randn(T, D, generator=g).to(dtype)  # the other group's output
    lane = torch.randn(T, D, generator=g)  # the CPU lane's sum (fp32, as uploaded)
    deferred = ffn(x, slots, weights, w_gate_up, w_down, defer=True)
    assert isinstance(deferred, PairSums)
    eager = ffn(x, slots, weights, w_gate_up, w_down)
    assert torch.equal(deferred.finish(other, lane), other + eager + lane.to(dtype))  # the engine's order
    assert torch.equal(ffn(x, slots, weights, w_gate_up, w_down, defer=True).finish(), eager)


@pytest.mark.parametrize("ffn", [expert_ffn_quant, expert_ffn_quant_host], ids=["triton", "reference"])
def test_a_deferred_packed_ffn_finishes_as_the_eager_adds(ffn):
    from tests.kernels.test_expert_ffn_quant import _inputs, _packed

    (gate, up, down), g = _packed("int4 sym g32", 5)
    x, slots, weights = _inputs(3, 64, g, torch.float32)
    lane = torch.randn(x.shape, generator=g)
    eager = ffn(x, slots, weights, gate, up, down)
    got = ffn(x, slots, weights, gate, up, down, defer=True).finish(lane)
    assert torch.equal(got, eager + lane.to(eager.dtype))
