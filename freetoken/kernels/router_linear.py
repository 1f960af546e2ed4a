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
from freetoken.kernels.linear_decode import tile_counters
from freetoken.kernels.router import pick_topk, router_scores, router_topk_ref, routing_outputs
from freetoken.kernels.tuning import num_sms

MAX_TILE = 8192  # elements of the [BLOCK_E, BLOCK_D] weight tile one step of a program reads
NUM_WARPS = 8  # 32 tile elements a thread: no register spills at 8 to 512 experts (ptxas, sm_90 and sm_120). The
#                earlier BLOCK_E // 64 (1 warp to 64 experts, 2 at 128) spilled up to 1.5 KB a thread, and LLVM took
#                8.9 s (sm_90) / 22.9 s (sm_120) over the 128-expert prefill variant (now 0.5-1.0 s)


@triton.jit
def _router_linear_topk_kernel(
    # Pointers
    h_ptr, w_ptr, part_ptr, done_ptr, weights_ptr, ids_ptr,
    # Dimensions
    E, D, K, d_per_split,
    # Strides
    stride_h, stride_w, stride_ow, stride_oi,
    # Meta-parameters
    RENORMALIZE: tl.constexpr, SPLIT: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Program (t, p): token t's logits over features [p * d_per_split, +d_per_split). Without SPLIT (one program
    per token) it picks the top k itself; with SPLIT each program stores its partial sums and the last to finish
    (the acq_rel counter done[t]) adds them in split order, picks, and zeroes the counter for the next launch."""
    t = tl.program_id(0)
    p = tl.program_id(1)
    offs_e = tl.arange(0, BLOCK_E)
    valid = offs_e < E
    acc = tl.zeros([BLOCK_E], dtype=tl.float32)
    lo = p * d_per_split
    for d0 in range(lo, tl.minimum(lo + d_per_split, D), BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        dmask = offs_d < D
        w = tl.load(w_ptr + offs_e[:, None] * stride_w + offs_d[None, :], mask=valid[:, None] & dmask[None, :],
                    other=0.0)
        h = tl.load(h_ptr + t * stride_h + offs_d, mask=dmask, other=0.0).to(w_ptr.dtype.element_ty)  # router dtype
        acc += tl.sum(w.to(tl.float32) * h.to(tl.float32)[None, :], axis=1)
    if SPLIT:
        P = tl.num_programs(1)
        tl.store(part_ptr + (t * P + p) * BLOCK_E + offs_e, acc)
        if tl.atomic_add(done_ptr + t, 1) == P - 1:  # the others' partial sums are visible past this point
            acc = tl.zeros([BLOCK_E], dtype=tl.float32)
            for i in range(0, P):
                acc += tl.load(part_ptr + (t * P + i) * BLOCK_E + offs_e, cache_modifier=".cg")
            tl.store(done_ptr + t, 0)
            _pick(acc, valid, offs_e, t, w_ptr, weights_ptr, ids_ptr, K, stride_ow, stride_oi, RENORMALIZE,
                  BLOCK_E, BLOCK_K)
    else:
        _pick(acc, valid, offs_e, t, w_ptr, weights_ptr, ids_ptr, K, stride_ow, stride_oi, RENORMALIZE, BLOCK_E,
              BLOCK_K)


@triton.jit
def _pick(acc, valid, offs_e, t, w_ptr, weights_ptr, ids_ptr, K, stride_ow, stride_oi, RENORMALIZE: tl.constexpr,
          BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    """Logits rounded to the router's dtype (as the linear rounds them), softmax, the K largest (ties: lowest id)."""
    offs_k = tl.arange(0, BLOCK_K)
    logits = acc.to(w_ptr.dtype.element_ty).to(tl.float32)
    logits = tl.where(valid, logits, -float("inf"))
    probs = router_scores(logits, valid, "softmax")  # [BE]
    sel_w, sel_id = pick_topk(tl.where(valid, probs, -float("inf")), probs, offs_e, offs_k, K, RENORMALIZE, BLOCK_E,
                               BLOCK_K)
    kmask = offs_k < K
    tl.store(weights_ptr + t * stride_ow + offs_k, sel_w, mask=kmask)
    tl.store(ids_ptr + t * stride_oi + offs_k, sel_id, mask=kmask)


MAX_SPLIT_TOKENS = 8  # decode batch sizes: fewer tokens than SMs, so the features are split across programs


def router_splits(T: int, D: int, block_d: int, device: torch.device) -> int:
    """Programs per token: one per BLOCK_D tile up to about one wave (a token's whole router read by one SM took
    37 us per layer on an H100, 2048 x 128 bf16); one for prefill-sized T."""
    if T > MAX_SPLIT_TOKENS:
        return 1
    sms = num_sms(device) if device.type == "cuda" else 4  # (the interpreter: a few programs, run one by one)
    return max(1, min(triton.cdiv(D, block_d), sms // T))


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
    BLOCK_E = triton.next_power_of_2(E)
    BLOCK_D = max(16, min(triton.next_power_of_2(D), MAX_TILE // BLOCK_E))
    splits = router_splits(T, D, BLOCK_D, h.device)
    d_per = triton.cdiv(triton.cdiv(D, BLOCK_D), splits) * BLOCK_D
    splits = triton.cdiv(D, d_per)  # every split holds at least one tile
    part = torch.empty((T, splits, BLOCK_E), dtype=torch.float32, device=h.device) if splits > 1 else weights
    done = tile_counters(h.device)[:T] if splits > 1 else ids  # linear_decode's, zero between launches per stream
    # 3. launch
    _router_linear_topk_kernel[(T, splits)](
        h, w, part, done, weights, ids, E, D, k, d_per, h.stride(0), w.stride(0), weights.stride(0), ids.stride(0),
        RENORMALIZE=bool(renormalize), SPLIT=splits > 1, BLOCK_E=BLOCK_E, BLOCK_D=BLOCK_D,
        BLOCK_K=triton.next_power_of_2(k), num_warps=NUM_WARPS)
    return weights, ids


def router_linear_topk_ref(h: torch.Tensor, w: torch.Tensor, k: int,
                           renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The composition it replaces: linear_ref in the router's dtype, then router_topk_ref."""
    return router_topk_ref(linear_ref(h.to(w.dtype), w), k, renormalize)
