"""The router's projection and its softmax top-k in one launch (was a linear and router_topk per MoE layer), for the
plain router: softmax scores, no router bias, no correction bias, no groups, scale 1 (Qwen3-MoE, Mixtral, OLMoE).

    h [T, D], w [E, D] -> logits h @ w.T (fp32 sums, rounded to w's dtype as the linear rounds them)
      -> the k largest softmax scores (ties to the lower id), optionally renormalised -> weights [T, k], ids [T, k]
"""

from __future__ import annotations

import torch

from freetoken.kernels.checks import check_same_device, check_tensor
from freetoken.kernels.lazy import tl, triton
from freetoken.kernels.linear import linear_ref
from freetoken.kernels.router import pick_topk, router_scores, router_topk_ref, routing_outputs

MAX_TILE = 8192  # elements of the [BLOCK_E, BLOCK_D] weight tile one step of a program reads


@triton.jit
def _router_linear_topk_kernel(
    # Pointers
    h_ptr, w_ptr, weights_ptr, ids_ptr,
    # Dimensions
    E, D, K,
    # Strides
    stride_h, stride_w, stride_ow, stride_oi,
    # Meta-parameters
    RENORMALIZE: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One token per program: every expert's logit, then K rounds of (max, lowest id holding it, knock it out)."""
    t = tl.program_id(0)
    offs_e = tl.arange(0, BLOCK_E)
    offs_k = tl.arange(0, BLOCK_K)
    valid = offs_e < E
    acc = tl.zeros([BLOCK_E], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        dmask = offs_d < D
        w = tl.load(w_ptr + offs_e[:, None] * stride_w + offs_d[None, :], mask=valid[:, None] & dmask[None, :],
                    other=0.0)
        h = tl.load(h_ptr + t * stride_h + offs_d, mask=dmask, other=0.0).to(w.dtype)  # h cast to the router's dtype
        acc += tl.sum(w.to(tl.float32) * h.to(tl.float32)[None, :], axis=1)
    logits = acc.to(w_ptr.dtype.element_ty).to(tl.float32)
    logits = tl.where(valid, logits, -float("inf"))
    probs = router_scores(logits, valid, "softmax")  # [BE]
    sel_w, sel_id = pick_topk(tl.where(valid, probs, -float("inf")), probs, offs_e, offs_k, K, RENORMALIZE, BLOCK_E,
                               BLOCK_K)
    kmask = offs_k < K
    tl.store(weights_ptr + t * stride_ow + offs_k, sel_w, mask=kmask)
    tl.store(ids_ptr + t * stride_oi + offs_k, sel_id, mask=kmask)


def router_linear_topk(h: torch.Tensor, w: torch.Tensor, k: int,
                       renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """h [T, D], w [E, D] -> (weights [T, k] fp32, ids [T, k] int32), in descending score."""
    # 1. check
    check_tensor(h, "h", 2)
    check_tensor(w, "w", 2)
    check_same_device(h=h, w=w)
    T, D = h.shape
    E = w.shape[0]
    if w.shape[1] != D:
        raise ValueError(f"w: shape {tuple(w.shape)} does not match h's {D} features")
    if not 1 <= k <= E:
        raise ValueError(f"k: {k} must be in [1, {E}]")
    # 2. allocate
    weights, ids = routing_outputs(T, k, h.device)
    if T == 0:
        return weights, ids
    # 3. launch
    BLOCK_E = triton.next_power_of_2(E)
    BLOCK_D = max(16, min(triton.next_power_of_2(D), MAX_TILE // BLOCK_E))
    _router_linear_topk_kernel[(T,)](h, w, weights, ids, E, D, k, h.stride(0), w.stride(0), weights.stride(0),
                                     ids.stride(0), RENORMALIZE=bool(renormalize), BLOCK_E=BLOCK_E, BLOCK_D=BLOCK_D,
                                     BLOCK_K=triton.next_power_of_2(k), num_warps=min(max(BLOCK_E // 64, 1), 8))
    return weights, ids


def router_linear_topk_ref(h: torch.Tensor, w: torch.Tensor, k: int,
                           renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The composition it replaces: linear_ref in the router's dtype, then router_topk_ref."""
    return router_topk_ref(linear_ref(h.to(w.dtype), w), k, renormalize)
