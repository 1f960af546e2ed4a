"""Placement decision on the device: one MoE call's expert ids -> slot ids, copy list and evictions, in one program.

The state is the compiled placement's core arrays (freetoken.placement.compiled.core) held in device tensors, so a
decode step can decide without returning to the host (FreeToken's lru_ensure):
    slot_of      int32 [K]  slot of each key (layer * E + expert), -1 = not resident
    key_of_slot  int32 [C]  key held by each slot, -1 = empty
    last_use     int64 [K]  clock of each key's latest access, -1 = never
    ints         int64 [2]  CLOCK (accesses applied), USED (slots ever handed out, as the compiled Core counts them:
                            slots are never given back, only passed from victim to newcomer)
Why no recency list for LRU: in the reference (placement/policies/lru.py) a key moves to the back of the order exactly
when it is accessed while resident (hit) or admitted (its miss), so among resident keys the LRU order is last_use
order, and the call's own keys, which must not be evicted, are exactly those with last_use >= the call's start clock
once the call's clocks are written. The victim is then an argmin over the slots.

Outputs per call entry i (call order): kind 0 hit / 1 fetched / 2 cpu / -1 padding, slot (-1: cpu, or a fetch that
runs from a staging buffer); the copy list (expert, slot) of fetches in call order; evicted keys in eviction order;
counts [3] = (fetches, evictions, valid entries).
"""

from __future__ import annotations

import torch

from freetoken.kernels.checks import interpreting
from freetoken.kernels.lazy import tl, triton

CLOCK, USED = tl.constexpr(0), tl.constexpr(1)
ORDERS = ("most_tokens", "most_recent", "lowest_id")  # = freetoken.placement.split.FETCH_ORDERS
INT64_MAX = tl.constexpr(2**63 - 1)


@triton.jit
def _placement_kernel(
    # Pointers
    experts_ptr, tokens_ptr, slot_of_ptr, key_of_slot_ptr, last_use_ptr, ints_ptr, fetch_count_ptr,
    kind_ptr, slot_ptr, copy_expert_ptr, copy_slot_ptr, evict_ptr, counts_ptr,
    # Dimensions
    n, layer, E, C, num_keys, min_pairs,
    # Meta-parameters
    ADMIT: tl.constexpr, ORDER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """experts [n] int32 distinct ids of one layer (trailing -1 = padding, so a graph can hold a fixed n), tokens [n]
    int32; fetch_count [E + 1] int32 = the split's fetch count for m misses. One program (grid (1,))."""
    # hit / miss fixed at the call's start; the split picks the misses to fetch (rank = split.FETCH_ORDERS)
    offs = tl.arange(0, BLOCK_N)
    experts = tl.load(experts_ptr + offs, mask=offs < n, other=-1)  # [BN]
    valid = experts >= 0
    keys = tl.where(valid, experts, 0).to(tl.int64) + layer * E  # [BN]
    slot0 = tl.load(slot_of_ptr + keys, mask=valid, other=-1)  # [BN]
    before_use = tl.load(last_use_ptr + keys, mask=valid, other=0)  # [BN] int64
    tokens = tl.load(tokens_ptr + offs, mask=valid, other=0).to(tl.int64)  # [BN]
    miss = valid & (slot0 < 0)
    m = tl.sum(miss.to(tl.int32), axis=0)
    q = tl.load(fetch_count_ptr + m)
    if min_pairs > 0:
        q = tl.where(tl.sum(tl.where(miss, tokens, 0), axis=0) >= min_pairs, m, q)
    if ORDER == 0:
        rank = -tokens * num_keys + keys
    elif ORDER == 1:
        rank = -before_use * num_keys + keys
    else:
        rank = keys
    rank = tl.where(miss, rank, INT64_MAX)  # distinct over misses: the key breaks ties
    ahead = tl.sum(((rank[None, :] < rank[:, None]) & miss[None, :]).to(tl.int32), axis=1)  # [BN] misses ranked first
    fetch = miss & (ahead < q)
    kind = tl.where(slot0 >= 0, 0, tl.where(fetch, 1, 2))
    kind = tl.where(valid, kind, -1)
    tl.store(kind_ptr + offs, kind, mask=offs < n)
    tl.store(slot_ptr + offs, tl.where(slot0 >= 0, slot0, -1), mask=offs < n)
    # accesses apply in call order: entry i at clock start + i
    start = tl.load(ints_ptr + CLOCK)
    count = tl.sum(valid.to(tl.int64), axis=0)
    tl.store(last_use_ptr + keys, start + offs, mask=valid)
    tl.store(ints_ptr + CLOCK, start + count)
    tl.debug_barrier()
    # fetches in call order: a free slot, else the least recent resident key not of this call, else staging (-1)
    used = tl.load(ints_ptr + USED)
    nc = used * 0
    ne = used * 0
    for i in range(0, n):
        if tl.load(kind_ptr + i) == 1:
            e = tl.load(experts_ptr + i)
            s = used * 0 - 1
            if ADMIT:
                key = layer * E + e
                if used < C:
                    s = used
                    used += 1
                else:
                    best = start * 0 + INT64_MAX
                    for c0 in range(0, C, BLOCK_C):
                        offs_c = c0 + tl.arange(0, BLOCK_C)
                        held = tl.load(key_of_slot_ptr + offs_c, mask=offs_c < C, other=-1)  # [BC]
                        age = tl.load(last_use_ptr + held, mask=held >= 0, other=INT64_MAX)  # [BC]
                        age = tl.where(age < start, age, INT64_MAX)
                        low = tl.min(age, axis=0)
                        if low < best:
                            best = low
                            s = c0 + tl.argmin(age, axis=0).to(tl.int64)
                    if s >= 0:
                        out = tl.load(key_of_slot_ptr + s)
                        tl.store(slot_of_ptr + out, -1)
                        tl.store(evict_ptr + ne, out)
                        ne += 1
                if s >= 0:
                    tl.store(slot_of_ptr + key, s.to(tl.int32))
                    tl.store(key_of_slot_ptr + s, key.to(tl.int32))
                    tl.store(slot_ptr + i, s.to(tl.int32))
                tl.debug_barrier()
            tl.store(copy_expert_ptr + nc, e)
            tl.store(copy_slot_ptr + nc, s.to(tl.int32))
            nc += 1
    tl.store(ints_ptr + USED, used)
    tl.store(counts_ptr + 0, nc)
    tl.store(counts_ptr + 1, ne)
    tl.store(counts_ptr + 2, count)


def place_call(state: tuple[torch.Tensor, ...], layer: int, experts: torch.Tensor, tokens: torch.Tensor,
               fetch_count: torch.Tensor, order: str, min_pairs: int, admit: bool,
               out: tuple[torch.Tensor, ...] | None = None, block_c: int = 256) -> tuple[torch.Tensor, ...]:
    """Decide one call on the device. state = (slot_of, key_of_slot, last_use, ints), updated in place.
    Returns (kind [n] int32, slot [n] int32, copy_expert [n] int32, copy_slot [n] int32, evict [n] int32,
    counts [3] int64); `out` reuses those buffers (a graph's fixed addresses)."""
    slot_of, key_of_slot, last_use, ints = state
    if experts.dtype != torch.int32 or tokens.dtype != torch.int32 or experts.shape != tokens.shape:
        raise ValueError(f"experts / tokens: expected two int32 [n] tensors, got {experts.dtype} "
                         f"{tuple(experts.shape)} and {tokens.dtype} {tuple(tokens.shape)}")
    if experts.device != slot_of.device or (slot_of.device.type != "cuda" and not interpreting()):
        raise ValueError(f"experts: on {experts.device}, state on {slot_of.device} (CPU runs only interpreted)")
    if order not in ORDERS:
        raise ValueError(f"fetch order {order!r} is not one of {', '.join(ORDERS)}")
    n = experts.numel()
    if out is None:
        out = tuple(torch.empty(n, dtype=torch.int32, device=experts.device) for _ in range(5)) + (
            torch.empty(3, dtype=torch.int64, device=experts.device),)
    C = key_of_slot.numel()
    _placement_kernel[(1,)](
        experts, tokens, slot_of, key_of_slot, last_use, ints, fetch_count, *out,
        n, layer, fetch_count.numel() - 1, C, slot_of.numel(), min_pairs,
        ADMIT=bool(admit) and C > 0, ORDER=ORDERS.index(order), BLOCK_N=max(16, triton.next_power_of_2(n)),
        BLOCK_C=max(16, min(block_c, triton.next_power_of_2(max(C, 1)))),
    )
    return out
