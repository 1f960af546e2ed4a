"""A MoE call's slot ids from the device decision, in one launch: what was ~45 small torch ops per MoE layer
(staging rows, expert -> slot / kind maps, slot ids per (token, pick), the call's counters).

    decision (kernels/placement.py): kind [n], slot [n], copy list (copy_expert, copy_slot) [n], counts [3]
      -> copy_slot: a fetch the policy does not keep gets a staging row, capacity + its rank among those (in place)
      -> slots [T K]: each pick's slot (a hit's, or where its fetch lands), -1 for a CPU expert;
         hit_slots / fetch_slots: the same, -1 outside hits / fetches (the pipelined FFNs' halves)
      -> totals[phase] += (1 call, hits, fetched, cpu, evictions, 0, cpu pairs)

One program: n <= E experts and T K picks of a decode call fit one block each.
"""

from __future__ import annotations

import torch

from freetoken.kernels.checks import interpreting
from freetoken.kernels.lazy import tl, triton


@triton.jit
def _moe_slots_kernel(
    # Pointers
    ids_ptr, experts_ptr, kind_ptr, slot_ptr, copy_expert_ptr, copy_slot_ptr, counts_ptr, totals_ptr,
    slots_ptr, hit_slots_ptr, fetch_slots_ptr, readback_ptr,
    # Dimensions
    M, n, capacity, phase,
    # Meta-parameters
    READBACK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """ids [M] int32 (the picks), experts / kind / slot / copy_expert / copy_slot [n] int32, counts [3] int64
    (copies, evictions, -), totals [2, 7] int64; slots / hit_slots / fetch_slots [M] int32; readback [2 n + M]
    int32 (READBACK: experts, kind, ids side by side, for the CPU lane's one read). Grid (1,)."""
    j = tl.arange(0, BLOCK_N)  # [N]
    in_n = j < n
    experts = tl.load(experts_ptr + j, mask=in_n, other=-1)
    kind = tl.load(kind_ptr + j, mask=in_n, other=-1)
    slot = tl.load(slot_ptr + j, mask=in_n, other=-1)
    copy_expert = tl.load(copy_expert_ptr + j, mask=in_n, other=-1)
    copy_slot = tl.load(copy_slot_ptr + j, mask=in_n, other=-1)
    copies = tl.load(counts_ptr + 0).to(tl.int32)
    evictions = tl.load(counts_ptr + 1)
    # staging rows for fetches the policy does not keep
    live = in_n & (j < copies)  # [N] copy-list entries
    unkept = live & (copy_slot < 0)
    rank = tl.cumsum(unkept.to(tl.int32), axis=0) - 1
    copy_slot = tl.where(unkept, capacity + rank, copy_slot)
    tl.store(copy_slot_ptr + j, copy_slot, mask=in_n)
    # each pick's kind and slot: its expert's entry in the decision / the copy list (experts are distinct)
    m = tl.arange(0, BLOCK_M)  # [M]
    in_m = m < M
    ids = tl.load(ids_ptr + m, mask=in_m, other=-2)
    decided = (ids[:, None] == experts[None, :]) & (kind[None, :] >= 0)  # [M, N]
    known = tl.sum(decided.to(tl.int32), axis=1) > 0
    pick_kind = tl.where(known, tl.sum(tl.where(decided, kind[None, :], 0), axis=1), 2)  # [M] (unknown: cpu)
    hit = decided & (kind[None, :] == 0)
    copied = (ids[:, None] == copy_expert[None, :]) & live[None, :]
    from_hit = tl.sum(tl.where(hit, slot[None, :] + 1, 0), axis=1)  # [M] slot + 1, 0 when none
    from_copy = tl.sum(tl.where(copied, copy_slot[None, :] + 1, 0), axis=1)
    slots = tl.where(from_copy > 0, from_copy, from_hit) - 1  # [M] (the copy list wins, as scattered last)
    tl.store(slots_ptr + m, slots, mask=in_m)
    tl.store(hit_slots_ptr + m, tl.where(pick_kind == 0, slots, -1), mask=in_m)
    tl.store(fetch_slots_ptr + m, tl.where(pick_kind == 1, slots, -1), mask=in_m)
    if READBACK:
        tl.store(readback_ptr + j, experts, mask=in_n)
        tl.store(readback_ptr + n + j, kind, mask=in_n)
        tl.store(readback_ptr + 2 * n + m, ids, mask=in_m)
    # the call's counters
    row = totals_ptr + phase * 7
    hits = tl.sum((in_n & (kind == 0)).to(tl.int64), axis=0)
    cpu = tl.sum((in_n & (kind == 2)).to(tl.int64), axis=0)
    cpu_pairs = tl.sum((in_m & (slots < 0)).to(tl.int64), axis=0)
    tl.store(row + 0, tl.load(row + 0) + 1)
    tl.store(row + 1, tl.load(row + 1) + hits)
    tl.store(row + 2, tl.load(row + 2) + copies.to(tl.int64))
    tl.store(row + 3, tl.load(row + 3) + cpu)
    tl.store(row + 4, tl.load(row + 4) + evictions)
    tl.store(row + 6, tl.load(row + 6) + cpu_pairs)


def moe_slots(ids: torch.Tensor, experts: torch.Tensor, kind: torch.Tensor, slot: torch.Tensor,
              copy_expert: torch.Tensor, copy_slot: torch.Tensor, counts: torch.Tensor, totals: torch.Tensor,
              capacity: int, phase: int, readback: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids [T, K] int32 and place_call's outputs -> (slots, hit_slots, fetch_slots) [T, K] int32; copy_slot
    rewritten (staging rows) and totals[phase] added to, in place; readback [2 n + T K] int32 (optional) gets
    experts, kind and ids side by side. No sync."""
    # 1. check
    n = experts.numel()
    for name, t in (("experts", experts), ("kind", kind), ("slot", slot), ("copy_expert", copy_expert),
                    ("copy_slot", copy_slot)):
        if t.dtype != torch.int32 or t.shape != (n,) or not t.is_contiguous():
            raise ValueError(f"moe_slots: {name} must be a contiguous int32 [{n}], got {t.dtype} {tuple(t.shape)}")
    if ids.dtype != torch.int32 or ids.dim() != 2:
        raise ValueError(f"moe_slots: ids must be int32 [T, K], got {ids.dtype} {tuple(ids.shape)}")
    if totals.dtype != torch.int64 or totals.shape != (2, 7) or counts.dtype != torch.int64:
        raise ValueError("moe_slots: counts and totals [2, 7] must be int64")
    if ids.device.type != "cuda" and not interpreting():
        raise ValueError(f"moe_slots: ids on {ids.device} (CPU runs only interpreted)")
    if readback is not None and (readback.dtype != torch.int32 or readback.shape != (2 * n + ids.numel(),)):
        raise ValueError(f"moe_slots: readback must be int32 [{2 * n + ids.numel()}]")
    # 2. allocate
    ids = ids.contiguous()
    out = torch.empty((3,) + tuple(ids.shape), dtype=torch.int32, device=ids.device)  # [3, T, K]
    # 3. launch
    M = ids.numel()
    _moe_slots_kernel[(1,)](ids, experts, kind, slot, copy_expert, copy_slot, counts, totals, out[0], out[1], out[2],
                            out if readback is None else readback, M, n, capacity, phase,
                            READBACK=readback is not None, BLOCK_M=max(16, triton.next_power_of_2(M)),
                            BLOCK_N=max(16, triton.next_power_of_2(max(n, 1))))
    return out[0], out[1], out[2]


def moe_slots_ref(ids: torch.Tensor, experts: torch.Tensor, kind: torch.Tensor, slot: torch.Tensor,
                  copy_expert: torch.Tensor, copy_slot: torch.Tensor, counts: torch.Tensor, totals: torch.Tensor,
                  capacity: int, phase: int, readback: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The torch reference: scatter maps over the E experts, then index them by the picks."""
    if readback is not None:
        readback.copy_(torch.cat([experts, kind, ids.reshape(-1)]))
    E = int(max(int(ids.max()), int(experts.max())) + 1)
    n, dev = experts.numel(), ids.device
    live = torch.arange(n, device=dev) < counts[0]  # [n] copy-list entries
    unkept = live & (copy_slot < 0)
    copy_slot.copy_(torch.where(unkept, capacity + torch.cumsum(unkept.to(torch.int32), 0) - 1, copy_slot))
    slot_map = torch.full((E + 1,), -1, dtype=torch.int32, device=dev)  # expert -> slot, E: dropped
    kind_map = torch.full((E + 1,), 2, dtype=torch.int32, device=dev)  # expert -> kind
    slot_map.scatter_(0, torch.where(kind == 0, experts, E).long(), slot)
    slot_map.scatter_(0, torch.where(live, copy_expert, E).long(), copy_slot)
    kind_map.scatter_(0, torch.where(kind >= 0, experts, E).long(), kind)
    idx = ids.long()
    slots, kinds = slot_map[idx], kind_map[idx]  # [T, K]
    totals[phase] += torch.stack([torch.ones_like(counts[0]), (kind == 0).sum(), counts[0], (kind == 2).sum(),
                                  counts[1], torch.zeros_like(counts[0]), (slots < 0).sum()])
    return slots, torch.where(kinds == 0, slots, -1), torch.where(kinds == 1, slots, -1)
