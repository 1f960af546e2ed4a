"""Prefill padding bounded by the experts a call touches: a big pool (S slots) whose call uses only E of them pads
at most E runs, not S; the live blocks are the same, and expert_ffn with that bound equals the reference."""

from __future__ import annotations

import torch

from freetoken.kernels import expert_ffn, expert_ffn_ref
from freetoken.kernels.moe_align import align_by_slot
from tests.kernels.tolerances import assert_close


def test_padding_bounded_by_the_calls_experts():
    T, K, S, E, block_m = 40, 2, 1000, 4, 16  # 80 pairs over E = 4 slots of a 1000-slot pool
    g = torch.Generator().manual_seed(0)
    used = torch.tensor([7, 123, 500, 999])
    slots = used[torch.randint(0, E, (T, K), generator=g)].to(torch.int32)
    wide = align_by_slot(slots, S, block_m)
    tight = align_by_slot(slots, S, block_m, max_groups=E)
    # hand-derived bounds: T*K + min(S, T*K) * (bm - 1) vs T*K + E * (bm - 1), each rounded up to bm
    assert wide.pairs.numel() == -(-(80 + 80 * 15) // 16) * 16 == 1280
    assert tight.pairs.numel() == -(-(80 + 4 * 15) // 16) * 16 == 144
    live = int((wide.block_slot >= 0).sum())
    assert live == int((tight.block_slot >= 0).sum())
    assert torch.equal(wide.block_slot[:live], tight.block_slot[:live])
    assert torch.equal(wide.pairs[:live * block_m], tight.pairs[:live * block_m])
    assert set(tight.block_slot[live:].tolist()) <= {-1}


def test_expert_ffn_with_the_bound_equals_reference():
    T, K, S, D, I = 12, 2, 64, 16, 16  # 24 pairs: the prefill path (grouped, padded blocks)
    g = torch.Generator().manual_seed(1)
    w_gate_up = torch.randn(S, 2 * I, D, generator=g) / D**0.5
    w_down = torch.randn(S, D, I, generator=g) / I**0.5
    used = torch.tensor([3, 40, 63, -1])
    slots = used[torch.randint(0, 4, (T, K), generator=g)].to(torch.int32)
    x, weights = torch.randn(T, D, generator=g), torch.rand(T, K, generator=g)
    out = expert_ffn(x, slots, weights, w_gate_up, w_down, max_experts=4)
    assert_close(out, expert_ffn_ref(x, slots, weights, w_gate_up, w_down))
