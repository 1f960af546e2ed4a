"""Group (token, k) pairs by expert slot and pad each group to the GEMM block, as vLLM's moe_align_block_size does.

Torch glue with no host synchronisation: every size is an upper bound known from the shapes, and blocks past the
padded total carry slot -1 so the kernels return at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SlotBlocks:
    """pairs [P] int32: pair id t*K + k in slot order, each slot's run padded to block_m with the sentinel T*K.
    block_slot [P / block_m] int32: the slot every block of block_m rows multiplies with, -1 past the end."""

    pairs: torch.Tensor
    block_slot: torch.Tensor
    block_m: int


def align_by_slot(slot_ids: torch.Tensor, num_slots: int, block_m: int, max_groups: int | None = None) -> SlotBlocks:
    """slot_ids [T, K] (-1 = not resident, dropped) -> SlotBlocks. max_groups: at most this many distinct slots occur
    (a call's experts: one layer's E), so the padding is bounded by the experts a call can touch, not the pool."""
    # T = tokens, K = picks per token, S = slots, P = padded pair rows
    TK = slot_ids.numel()
    S = num_slots
    dev = slot_ids.device
    flat = slot_ids.reshape(-1).long()  # [TK]
    key = torch.where(flat >= 0, flat, S)  # non-resident pairs sort into bucket S, after every slot
    order = torch.argsort(key, stable=True)  # [TK]
    counts = torch.zeros(S + 1, dtype=torch.long, device=dev).scatter_add_(0, key, torch.ones_like(key))[:S]  # [S]
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)  # [S]
    pad_start = pad_end - padded
    raw_start = torch.cumsum(counts, 0) - counts
    sorted_key = key[order]  # [TK]
    valid = sorted_key < S
    slot_of_row = sorted_key.clamp(max=S - 1)
    rank = torch.arange(TK, device=dev) - raw_start[slot_of_row]
    groups = min(S, TK) if max_groups is None else min(S, TK, max_groups)
    P = (TK + groups * (block_m - 1) + block_m - 1) // block_m * block_m
    dest = torch.where(valid, pad_start[slot_of_row] + rank, P)  # dropped pairs land in a spare last row
    pairs = torch.full((P + 1,), TK, dtype=torch.int32, device=dev)
    pairs.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(0, P, block_m, device=dev)  # [P / block_m]
    block_slot = torch.searchsorted(pad_end, block_start, right=True)
    block_slot = torch.where(block_start < pad_end[-1], block_slot, -1).to(torch.int32)
    return SlotBlocks(pairs=pairs[:P], block_slot=block_slot, block_m=block_m)
