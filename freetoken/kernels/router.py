"""Router top-k: softmax over the experts in fp32, the k largest (ties to the lower id), optionally renormalised.

Mixtral's "softmax over the top-k logits" equals softmax-then-top-k renormalised (softmax is monotonic), so one
kernel serves Qwen3-MoE (norm_topk_prob=True), Mixtral (True) and OLMoE (False).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from freetoken.kernels.checks import check_tensor

MAX_EXPERTS = 4096


@triton.jit
def _router_topk_kernel(
    # Pointers
    logits_ptr, weights_ptr, ids_ptr,
    # Dimensions
    E, K,
    # Strides
    stride_l, stride_w, stride_i,
    # Meta-parameters
    RENORMALIZE: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One token per program: K rounds of (max, lowest id holding it, knock it out)."""
    t = tl.program_id(0)
    offs_e = tl.arange(0, BLOCK_E)
    offs_k = tl.arange(0, BLOCK_K)
    logits = tl.load(logits_ptr + t * stride_l + offs_e, mask=offs_e < E, other=-float("inf")).to(tl.float32)
    num = tl.exp(logits - tl.max(logits, axis=0))
    probs = num / tl.sum(num, axis=0)  # [BE]
    live = tl.where(offs_e < E, probs, -1.0)  # padding and chosen experts sit below every probability
    sel_w = tl.zeros([BLOCK_K], dtype=tl.float32)
    sel_id = tl.zeros([BLOCK_K], dtype=tl.int32)
    for i in range(K):
        best = tl.max(live, axis=0)
        best_id = tl.min(tl.where(live == best, offs_e, BLOCK_E), axis=0)
        sel_w = tl.where(offs_k == i, best, sel_w)
        sel_id = tl.where(offs_k == i, best_id, sel_id)
        live = tl.where(offs_e == best_id, -1.0, live)
    if RENORMALIZE:
        sel_w = sel_w / tl.sum(tl.where(offs_k < K, sel_w, 0.0), axis=0)
    kmask = offs_k < K
    tl.store(weights_ptr + t * stride_w + offs_k, sel_w, mask=kmask)
    tl.store(ids_ptr + t * stride_i + offs_k, sel_id, mask=kmask)


def router_topk(logits: torch.Tensor, k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, K] fp32, ids [T, K] int32), in descending weight."""
    # 1. check
    check_tensor(logits, "logits", 2)
    T, E = logits.shape
    if not 1 <= k <= E:
        raise ValueError(f"k: {k} must be in [1, {E}]")
    if E > MAX_EXPERTS:
        raise ValueError(f"logits: {E} experts > {MAX_EXPERTS} (one row per program)")
    # 2. allocate
    weights = torch.empty((T, k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((T, k), dtype=torch.int32, device=logits.device)
    if T == 0:
        return weights, ids
    # 3. launch
    BLOCK_E = triton.next_power_of_2(E)
    _router_topk_kernel[(T,)](
        logits, weights, ids,
        E, k,
        logits.stride(0), weights.stride(0), ids.stride(0),
        RENORMALIZE=bool(renormalize), BLOCK_E=BLOCK_E, BLOCK_K=triton.next_power_of_2(k),
        num_warps=min(max(BLOCK_E // 256, 1), 8),
    )
    return weights, ids


def router_topk_ref(logits: torch.Tensor, k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's routing: fp32 softmax, torch.topk, divide by the k weights' sum when renormalising. Equal weights come in
    torch.topk's (unspecified) order; the kernel puts the lower id first."""
    probs = torch.softmax(logits.float(), dim=-1)  # [T, E]
    weights, ids = torch.topk(probs, k, dim=-1)  # [T, K], descending
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)
