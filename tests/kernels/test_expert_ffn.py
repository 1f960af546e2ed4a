"""expert_ffn kernel vs its reference; slot grouping by hand; the reference vs HF's Qwen3MoeExperts (same weight layout)."""

from __future__ import annotations

import sys

import pytest
import torch

from freetoken.kernels import expert_ffn, expert_ffn_ref
from freetoken.kernels.moe_align import align_by_slot
from tests.kernels.tolerances import assert_close


def _weights(S, D, I, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    w_gate_up = (torch.randn(S, 2 * I, D, generator=g) / D**0.5).to(dtype)
    w_down = (torch.randn(S, D, I, generator=g) / I**0.5).to(dtype)
    return w_gate_up, w_down, g


def _run(T, K, S, D, I, dtype, slot_ids=None, seed=0):
    w_gate_up, w_down, g = _weights(S, D, I, dtype, seed)
    x = torch.randn(T, D, generator=g).to(dtype)
    if slot_ids is None:
        slot_ids = torch.randint(-1, S, (T, K), generator=g, dtype=torch.int32)
    weights = torch.rand(T, K, generator=g)
    out = expert_ffn(x, slot_ids, weights, w_gate_up, w_down)
    assert out.shape == (T, D) and out.dtype == dtype
    return out, expert_ffn_ref(x, slot_ids, weights, w_gate_up, w_down)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_decode_one_token_eight_slots(dtype):
    slots = torch.tensor([[3, 0, 7, -1, 5, 1, -1, 2]], dtype=torch.int32)
    assert_close(*_run(1, 8, 9, 48, 40, dtype, slot_ids=slots, seed=1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_prefill_seven_tokens_with_misses(dtype):
    assert_close(*_run(7, 3, 5, 40, 24, dtype, seed=2))


def test_repeated_slots_across_tokens_and_odd_sizes():
    """Every token uses slot 2 (a 7-row group), slot 0 twice; 21 pairs take the grouped path; sizes divide no block."""
    slots = torch.tensor([[2, 0, -1], [2, -1, 3], [2, 0, 1], [2, 1, -1], [2, -1, 3], [2, 3, 0], [2, 1, -1]],
                         dtype=torch.int32)
    assert_close(*_run(7, 3, 4, 33, 19, torch.float32, slot_ids=slots, seed=3))


def test_slot_runs_longer_than_one_block():
    """30 tokens x 2 picks over 2 slots: about 30 pairs per slot, two 16-row blocks each."""
    slots = torch.randint(0, 2, (30, 2), generator=torch.Generator().manual_seed(7), dtype=torch.int32)
    assert_close(*_run(30, 2, 2, 24, 16, torch.float32, slot_ids=slots, seed=7))


def test_many_tokens_take_the_large_row_block():
    """T = 40 groups pairs in 64-row blocks; 40 tokens x 2 picks over 3 slots fill several blocks per slot."""
    assert_close(*_run(40, 2, 3, 24, 16, torch.float32, seed=4))


@pytest.mark.parametrize("one_pair_limit", [0, 64])
def test_grouped_and_one_pair_per_block_paths_agree(monkeypatch, one_pair_limit):
    """The same 12 pairs through slot grouping (limit 0) and through one block per pair (limit 64)."""
    monkeypatch.setattr(sys.modules["freetoken.kernels.expert_ffn"], "MAX_PAIRS_ONE_PER_BLOCK", one_pair_limit)
    slots = torch.tensor([[1, 4, -1, 0], [4, 1, 2, -1], [-1, -1, 4, 3]], dtype=torch.int32)
    assert_close(*_run(3, 4, 5, 24, 20, torch.float32, slot_ids=slots, seed=6))


def test_out_of_range_slot_is_refused_on_cpu():
    with pytest.raises(ValueError, match="slot_ids: values"):
        _run(1, 2, 3, 8, 8, torch.float32, slot_ids=torch.tensor([[0, 3]], dtype=torch.int32))


def test_all_missing_gives_zeros():
    out, ref = _run(3, 2, 2, 16, 16, torch.float32, slot_ids=torch.full((3, 2), -1, dtype=torch.int32))
    assert torch.equal(out, torch.zeros(3, 16)) and torch.equal(ref, torch.zeros(3, 16))


def test_align_by_slot_groups_and_pads():
    # pairs (t*K + k): slot 1 <- 0, 3; slot 0 <- 2; pair 1 missing. block 4 -> slot 0 block, slot 1 block, then -1s
    slots = torch.tensor([[1, -1], [0, 1]], dtype=torch.int32)
    b = align_by_slot(slots, num_slots=3, block_m=4)
    pad = 4  # T * K = the padding sentinel
    assert b.pairs.tolist()[:8] == [2, pad, pad, pad, 0, 3, pad, pad]
    assert b.block_slot.tolist()[:2] == [0, 1] and set(b.block_slot.tolist()[2:]) == {-1}
    assert b.pairs.shape[0] % 4 == 0 and b.block_slot.shape[0] == b.pairs.shape[0] // 4


def test_reference_matches_hf_qwen3_moe_experts():
    """HF's per-expert loop (one_hot mask, index_add) with our slot tensors as its expert weights; -1 maps to HF's
    skipped class num_experts."""
    from transformers import AutoConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    T, K, S, D, I = 6, 3, 5, 16, 12
    w_gate_up, w_down, g = _weights(S, D, I, torch.float32, seed=5)
    x = torch.randn(T, D, generator=g)
    slots = torch.randint(-1, S, (T, K), generator=g, dtype=torch.int32)
    weights = torch.rand(T, K, generator=g)
    cfg = AutoConfig.for_model("qwen3_moe", hidden_size=D, moe_intermediate_size=I, num_experts=S, hidden_act="silu")
    hf = Qwen3MoeExperts(cfg)
    with torch.no_grad():
        hf.gate_up_proj.copy_(w_gate_up)
        hf.down_proj.copy_(w_down)
        expected = hf(x, torch.where(slots >= 0, slots, S).long(), weights)
    torch.testing.assert_close(expert_ffn_ref(x, slots, weights, w_gate_up, w_down), expected, rtol=1e-5, atol=1e-5)


def test_wrong_slot_dtype_is_named():
    w_gate_up, w_down, _ = _weights(2, 8, 4, torch.float32, seed=0)
    with pytest.raises(TypeError, match="slot_ids"):
        expert_ffn(torch.randn(1, 8), torch.zeros(1, 2, dtype=torch.int64), torch.ones(1, 2), w_gate_up, w_down)
