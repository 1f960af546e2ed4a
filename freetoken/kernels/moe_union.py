"""The distinct experts of a MoE call in first-use order, with their token counts, in one launch (a decode call's
union was ~14 small torch ops); the recorder's write of the call's routing rides along.

    ids [T, K] -> experts [n] int32 (first-use order, -1 after the last), tokens [n] int32 (0 after), n = min(T K, E)
    record [2, T, K] fp32 (optional, any strides): ids and routing weights, as the trace recorder keeps them

One program compares every pick with every other ([M, M] with M = T K), so it is for decode-sized calls
(M <= MAX_PICKS); engine/device_moe.call_union is the torch form the engine runs for larger calls.
"""

from __future__ import annotations

import torch

from freetoken.kernels.checks import interpreting
from freetoken.kernels.lazy import tl, triton

MAX_PICKS = 256  # T K of the largest call one program takes


@triton.jit
def _moe_union_kernel(
    # Pointers
    ids_ptr, weights_ptr, experts_ptr, tokens_ptr, record_ptr,
    # Dimensions
    M, K, n,
    # Strides
    stride_r0, stride_rt, stride_rk,
    # Meta-parameters
    RECORD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """ids / weights [M] (row-major [T, K]); experts / tokens [n]; record [2, T, K] by strides. Grid (1,)."""
    m = tl.arange(0, BLOCK_M)  # [M] picks
    in_m = m < M
    ids = tl.load(ids_ptr + m, mask=in_m, other=-1)
    mc = tl.arange(0, BLOCK_M)
    ids_c = tl.load(ids_ptr + mc, mask=mc < M, other=-2)  # the same picks, as columns (-2 never matches)
    same = ids[:, None] == ids_c[None, :]  # [M, M]
    earlier = tl.sum((same & (mc[None, :] < m[:, None])).to(tl.int32), axis=1)
    first = in_m & (earlier == 0)  # [M] the first use of its expert
    pos = tl.cumsum(first.to(tl.int32), axis=0) - 1  # [M] its place in the union
    count = tl.sum(same.to(tl.int32), axis=1)  # [M] tokens routed to it (a token picks an expert once)
    j = tl.arange(0, BLOCK_N)  # [N] union entries
    at = (pos[None, :] == j[:, None]) & first[None, :]  # [N, M]
    found = tl.sum(at.to(tl.int32), axis=1) > 0
    experts = tl.where(found, tl.sum(tl.where(at, ids[None, :], 0), axis=1), -1)
    tokens = tl.sum(tl.where(at, count[None, :], 0), axis=1)
    tl.store(experts_ptr + j, experts, mask=j < n)
    tl.store(tokens_ptr + j, tokens, mask=j < n)
    if RECORD:
        t, k = m // K, m % K
        w = tl.load(weights_ptr + m, mask=in_m, other=0.0)
        tl.store(record_ptr + t * stride_rt + k * stride_rk, ids.to(tl.float32), mask=in_m)
        tl.store(record_ptr + stride_r0 + t * stride_rt + k * stride_rk, w, mask=in_m)


def moe_union(ids: torch.Tensor, num_experts: int, weights: torch.Tensor | None = None,
              record: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, K] int32 -> (experts [n] int32, tokens [n] int32) as call_union; with record [2, T, K] fp32 (and
    weights [T, K] fp32) the call's ids and weights are written there too. No sync."""
    # 1. check
    if ids.dtype != torch.int32 or ids.dim() != 2:
        raise ValueError(f"moe_union: ids must be int32 [T, K], got {ids.dtype} {tuple(ids.shape)}")
    T, K = ids.shape
    M = T * K
    if M > MAX_PICKS:
        raise ValueError(f"moe_union: {M} picks > {MAX_PICKS} (use call_union for a call this large)")
    if ids.device.type != "cuda" and not interpreting():
        raise ValueError(f"moe_union: ids on {ids.device} (CPU runs only interpreted)")
    if record is not None:
        if weights is None or weights.shape != ids.shape or weights.dtype != torch.float32:
            raise ValueError("moe_union: recording needs weights, fp32 [T, K] like ids")
        if record.shape != (2, T, K) or record.dtype != torch.float32:
            raise ValueError(f"moe_union: record must be fp32 [2, {T}, {K}], got {tuple(record.shape)}")
    # 2. allocate
    ids = ids.contiguous()
    n = min(M, num_experts)
    out = torch.empty((2, n), dtype=torch.int32, device=ids.device)  # experts, tokens
    # 3. launch
    rec = record if record is not None else out
    strides = record.stride() if record is not None else (0, 0, 0)
    w = weights.contiguous() if record is not None else ids
    _moe_union_kernel[(1,)](ids, w, out[0], out[1], rec, M, K, n, *strides, RECORD=record is not None,
                            BLOCK_M=max(16, triton.next_power_of_2(M)), BLOCK_N=max(16, triton.next_power_of_2(n)))
    return out[0], out[1]


def moe_union_ref(ids: torch.Tensor, num_experts: int, weights: torch.Tensor | None = None,
                  record: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch reference: the kernel's algorithm, two M x M match matrices (O(M^2) memory, as the union was before
    device_moe.call_union's scatter form; a check, not for large calls), then the recorder's two writes."""
    if record is not None:
        record[0] = ids
        record[1] = weights
    flat = ids.reshape(-1).to(torch.int32)  # [M]
    M = flat.numel()
    n = min(M, num_experts)
    same = flat[:, None] == flat[None, :]  # [M, M]
    first = ~torch.tril(same, -1).any(1)  # [M] first use of its expert
    where = torch.where(first, torch.cumsum(first.to(torch.int64), 0) - 1, n)  # [M] position, n = dropped
    experts = torch.full((n + 1,), -1, dtype=torch.int32, device=ids.device)
    tokens = torch.zeros(n + 1, dtype=torch.int32, device=ids.device)
    experts.scatter_(0, where, flat)
    tokens.scatter_(0, where, same.sum(1, dtype=torch.int32))
    return experts[:n], tokens[:n]
