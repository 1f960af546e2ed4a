"""Gated DeltaNet FLOPs in the cost model: the card's count against transformers' chunked reference (its matmuls
counted by torch's FlopCounterMode) and a hand-derived call time."""

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from freetoken.sim.cost import CostOptions, charge
from freetoken.sim.model_card import LINEAR_CHUNK

from tests.test_cost_lanes import log_of, meta_of, toy_card, toy_hw

MS = 1e-3


def test_card_flops_are_the_chunked_delta_rules_matmuls():
    """transformers' torch_chunk_gated_delta_rule (chunks of 64) runs K K^T, Q K^T, the chunk's attention times V'
    and the state's three products as matmuls; it solves the two triangular systems where the chunked kernels
    build the inverse T (2 c^3 / 3) and multiply T (beta K), T (beta V) (2 c^2 (dk + dv)). With those added, its
    FLOPs are the card's, per token of every chunk."""
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    torch.manual_seed(0)
    T, Hk, Hv, dk, dv = 192, 1, 2, 8, 4
    q, k = torch.randn(1, T, Hk, dk), torch.randn(1, T, Hk, dk)
    v, g, beta = torch.randn(1, T, Hv, dv), -torch.rand(1, T, Hv), torch.rand(1, T, Hv)
    with FlopCounterMode(display=False) as counter:
        torch_chunk_gated_delta_rule(q, k, v, g, beta)
    c, chunks = LINEAR_CHUNK, T // LINEAR_CHUNK
    kernel_extra = Hv * chunks * (2 * c * c * (dk + dv) + 2 * c ** 3 / 3)
    card = toy_card(num_layers=2, linear_layers=1, linear_heads=Hv, linear_key_head_dim=dk, linear_value_head_dim=dv)
    assert card.linear_flops_per_token(T) * T == pytest.approx(counter.get_total_flops() + kernel_extra, rel=1e-12)


def test_decode_and_short_calls_use_their_own_chunk():
    # per value head: 6 dk dv + c (6 dk + 4 dv) + 2 c^2 / 3; dk = 4, dv = 8: 192 + 56 c + 2 c^2 / 3
    card = toy_card(num_layers=3, linear_layers=2, linear_heads=3, linear_key_head_dim=4, linear_value_head_dim=8)
    per_head = lambda c: 192 + 56 * c + 2 * c * c / 3  # noqa: E731
    got = card.linear_flops_per_token(np.array([1, 10, 64, 1000]))
    assert got == pytest.approx([6 * per_head(1), 6 * per_head(10), 6 * per_head(64), 6 * per_head(64)], rel=1e-12)


def test_a_prefill_call_is_charged_its_deltanet_flops_at_the_attention_rate():
    # toy (tests/test_cost_lanes.py): 1 TFLOP/s, one MoE layer. A 1000-token prefill call: dense GEMMs 2 x 3e6 x 1000
    # = 6 ms; one DeltaNet layer of 1000 heads of 100 x 100 at c = 64: 6e4 + 64 x 1000 + 2 x 64^2 / 3 = 126,730.67
    # FLOPs a head, 1.2673067e8 a token, 126.73067 ms for the call, added to the compute side (bytes: ~1 ms)
    plain = toy_card(num_layers=2)
    hybrid = toy_card(num_layers=2, linear_layers=1, linear_heads=1000, linear_key_head_dim=100,
                      linear_value_head_dim=100)
    times = [charge(log_of(dict(phase=0)), meta_of([1000]), card, toy_hw(), CostOptions(host="independent")).seconds[0]
             for card in (plain, hybrid)]
    assert times[1] - times[0] == pytest.approx((6e4 + 64e3 + 2 * 64 ** 2 / 3) * 1000 * 1000 / 1e12, rel=1e-9)
    assert times[0] == pytest.approx(6 * MS + 4 * 1 * 1000 * 500.5 / 1e12, rel=1e-9)


@pytest.mark.parametrize("fields, message", [
    (dict(num_layers=2, linear_layers=1), "'linear_heads'"),
    (dict(linear_layers=2, linear_heads=2), "exceed 'num_layers'"),
    (dict(num_layers=2, linear_layers=1, linear_heads=2, linear_key_head_dim=0), "linear_key_head_dim"),
])
def test_bad_linear_fields_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        toy_card(**fields)
