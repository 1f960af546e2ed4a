"""Router top-k: scores over the experts in fp32, the k largest (ties to the lower id), optionally renormalised.

Mixtral's "softmax over the top-k logits" equals softmax-then-top-k renormalised (softmax is monotonic), so one
kernel serves Qwen3-MoE (norm_topk_prob=True), Mixtral (True) and OLMoE (False).

DeepSeek options (defaults keep the plain softmax top-k): `score` "sigmoid" (V3) instead of "softmax"; `bias` [E]
fp32 added to the scores for the choice only (V3's e_score_correction_bias: the weights stay the unbiased scores);
group-limited top-k, `n_group` equal groups of experts of which the `topk_group` best are eligible, a group scored by
its best expert ("max", V2's group_limited_greedy) or its best two summed ("top2", V3); `scale` multiplies the
final weights (routed_scaling_factor). DeepSeek-V4: `score` "sqrtsoftplus" (sqrt(softplus(logit))), and hash-routed
layers whose picks are given (a token-id -> experts table): `router_weights` scores those picks only.
"""

from __future__ import annotations

import torch

from freetoken.kernels.checks import check_same_device, check_tensor
from freetoken.kernels.lazy import tl, triton

MAX_EXPERTS = 4096
SCORES = ("softmax", "sigmoid", "sqrtsoftplus")
GROUP_SCORES = ("max", "top2")


@triton.jit
def _router_topk_kernel(
    # Pointers
    logits_ptr, bias_ptr, weights_ptr, ids_ptr,
    # Dimensions
    E, K, N_GROUP, TOPK_GROUP, scale,
    # Strides
    stride_l, stride_w, stride_i,
    # Meta-parameters
    RENORMALIZE: tl.constexpr, SCORE: tl.constexpr, HAS_BIAS: tl.constexpr, GROUPED: tl.constexpr,
    GROUP_TOP2: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr,
):
    """One token per program: (groups: score each group, keep the best TOPK_GROUP), then K rounds of (max, lowest
    id holding it, knock it out) over the choice scores; each pick's weight is its unbiased score."""
    t = tl.program_id(0)
    offs_e = tl.arange(0, BLOCK_E)
    offs_k = tl.arange(0, BLOCK_K)
    valid = offs_e < E
    logits = tl.load(logits_ptr + t * stride_l + offs_e, mask=valid, other=-float("inf")).to(tl.float32)
    probs = router_scores(logits, valid, SCORE)  # [BE]
    choice = probs
    if HAS_BIAS:
        choice = probs + tl.load(bias_ptr + offs_e, mask=valid, other=0.0).to(tl.float32)
    live = tl.where(valid, choice, -float("inf"))  # padding and chosen experts sit below every score
    if GROUPED:
        group = offs_e // (E // N_GROUP)
        offs_g = tl.arange(0, BLOCK_G)
        group_score = tl.full([BLOCK_G], -float("inf"), tl.float32)
        for g in range(N_GROUP):
            in_g = valid & (group == g)
            first = tl.max(tl.where(in_g, live, -float("inf")), axis=0)
            s = first
            if GROUP_TOP2:
                first_id = tl.min(tl.where(in_g & (live == first), offs_e, BLOCK_E), axis=0)
                s = first + tl.max(tl.where(in_g & (offs_e != first_id), live, -float("inf")), axis=0)
            group_score = tl.where(offs_g == g, s, group_score)
        keep = offs_e < 0  # all False
        for i in range(TOPK_GROUP):
            best = tl.max(group_score, axis=0)
            best_g = tl.min(tl.where(group_score == best, offs_g, BLOCK_G), axis=0)
            keep = keep | (group == best_g)
            group_score = tl.where(offs_g == best_g, -float("inf"), group_score)
        live = tl.where(keep, live, -float("inf"))
    sel_w, sel_id = pick_topk(live, probs, offs_e, offs_k, K, RENORMALIZE, BLOCK_E, BLOCK_K)
    kmask = offs_k < K
    tl.store(weights_ptr + t * stride_w + offs_k, sel_w * scale, mask=kmask)
    tl.store(ids_ptr + t * stride_i + offs_k, sel_id, mask=kmask)


@triton.jit
def pick_topk(live, probs, offs_e, offs_k, K, RENORMALIZE: tl.constexpr, BLOCK_E: tl.constexpr,
               BLOCK_K: tl.constexpr):
    """K rounds of (max of live, lowest id holding it, knock it out) -> (the picks' probs [BK], optionally
    renormalised, and their ids [BK]); live [BE] is -inf on padding and on experts that cannot be picked."""
    sel_w = tl.zeros([BLOCK_K], dtype=tl.float32)
    sel_id = tl.zeros([BLOCK_K], dtype=tl.int32)
    for i in range(K):
        best = tl.max(live, axis=0)
        best_id = tl.min(tl.where(live == best, offs_e, BLOCK_E), axis=0)
        w = tl.sum(tl.where(offs_e == best_id, probs, 0.0), axis=0)
        sel_w = tl.where(offs_k == i, w, sel_w)
        sel_id = tl.where(offs_k == i, best_id, sel_id)
        live = tl.where(offs_e == best_id, -float("inf"), live)
    if RENORMALIZE:
        sel_w = sel_w / tl.sum(tl.where(offs_k < K, sel_w, 0.0), axis=0)
    return sel_w, sel_id


@triton.jit
def router_scores(logits, valid, SCORE: tl.constexpr):
    """SCORES of one token's logits [BE] in fp32 (0 on padding)."""
    if SCORE == "sigmoid":
        return tl.where(valid, tl.sigmoid(logits), 0.0)
    elif SCORE == "sqrtsoftplus":  # softplus as torch computes it: x past 20, else log(1 + e^x)
        soft = tl.where(logits > 20.0, logits, tl.log(1.0 + tl.exp(tl.minimum(logits, 20.0))))
        return tl.where(valid, tl.sqrt(soft), 0.0)
    else:
        num = tl.exp(logits - tl.max(logits, axis=0))
        return num / tl.sum(num, axis=0)


@triton.jit
def _router_weights_kernel(
    # Pointers
    logits_ptr, ids_ptr, weights_ptr,
    # Dimensions
    E, K, scale,
    # Strides
    stride_l, stride_i, stride_w,
    # Meta-parameters
    RENORMALIZE: tl.constexpr, SCORE: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One token per program: the scores of its given picks, renormalised, times scale."""
    t = tl.program_id(0)
    offs_e = tl.arange(0, BLOCK_E)
    offs_k = tl.arange(0, BLOCK_K)
    valid, kmask = offs_e < E, offs_k < K
    logits = tl.load(logits_ptr + t * stride_l + offs_e, mask=valid, other=-float("inf")).to(tl.float32)
    probs = router_scores(logits, valid, SCORE)  # [BE]
    ids = tl.load(ids_ptr + t * stride_i + offs_k, mask=kmask, other=-1)  # [BK]
    w = tl.sum(tl.where(ids[:, None] == offs_e[None, :], probs[None, :], 0.0), axis=1)  # [BK]
    if RENORMALIZE:
        w = w / tl.sum(tl.where(kmask, w, 0.0), axis=0)
    tl.store(weights_ptr + t * stride_w + offs_k, w * scale, mask=kmask)


def _check_options(E: int, k: int, score: str, n_group: int, topk_group: int, group_score: str) -> None:
    if score not in SCORES:
        raise ValueError(f"score: {score!r} is not one of {', '.join(SCORES)}")
    if group_score not in GROUP_SCORES:
        raise ValueError(f"group_score: {group_score!r} is not one of {', '.join(GROUP_SCORES)}")
    if n_group < 1 or E % n_group:
        raise ValueError(f"n_group: {n_group} must be >= 1 and divide the {E} experts")
    if not 1 <= topk_group <= n_group:
        raise ValueError(f"topk_group: {topk_group} must be in [1, {n_group}]")
    if k > topk_group * (E // n_group):
        raise ValueError(f"k: {k} exceeds the {topk_group} x {E // n_group} experts of the eligible groups")
    if group_score == "top2" and n_group > 1 and E // n_group < 2:
        raise ValueError("group_score 'top2' needs at least 2 experts per group")


def routing_outputs(T: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The (weights [T, k] fp32, ids [T, k] int32) a top-k routing kernel writes."""
    return (torch.empty((T, k), dtype=torch.float32, device=device),
            torch.empty((T, k), dtype=torch.int32, device=device))


def router_topk(logits: torch.Tensor, k: int, renormalize: bool, score: str = "softmax",
                bias: torch.Tensor | None = None, n_group: int = 1, topk_group: int = 1, group_score: str = "max",
                scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, K] fp32, ids [T, K] int32), in descending choice score."""
    # 1. check
    check_tensor(logits, "logits", 2)
    T, E = logits.shape
    if not 1 <= k <= E:
        raise ValueError(f"k: {k} must be in [1, {E}]")
    if E > MAX_EXPERTS:
        raise ValueError(f"logits: {E} experts > {MAX_EXPERTS} (one row per program)")
    _check_options(E, k, score, n_group, topk_group, group_score)
    if bias is not None:
        check_tensor(bias, "bias", 1, dtypes=(torch.float32,))
        check_same_device(logits=logits, bias=bias)
        if bias.shape[0] != E:
            raise ValueError(f"bias: {bias.shape[0]} entries, expected one per expert ({E})")
    # 2. allocate
    weights, ids = routing_outputs(T, k, logits.device)
    if T == 0:
        return weights, ids
    # 3. launch
    BLOCK_E = triton.next_power_of_2(E)
    _router_topk_kernel[(T,)](
        logits, bias if bias is not None else logits, weights, ids,
        E, k, n_group, topk_group, float(scale),
        logits.stride(0), weights.stride(0), ids.stride(0),
        RENORMALIZE=bool(renormalize), SCORE=score, HAS_BIAS=bias is not None, GROUPED=n_group > 1,
        GROUP_TOP2=group_score == "top2", BLOCK_E=BLOCK_E, BLOCK_K=triton.next_power_of_2(k),
        BLOCK_G=triton.next_power_of_2(n_group), num_warps=min(max(BLOCK_E // 256, 1), 8),
    )
    return weights, ids


def router_topk_ref(logits: torch.Tensor, k: int, renormalize: bool, score: str = "softmax",
                    bias: torch.Tensor | None = None, n_group: int = 1, topk_group: int = 1,
                    group_score: str = "max", scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's routing: fp32 softmax (or sigmoid), + bias for the choice, group scores (max / sum of the top 2) and
    torch.topk of groups, ineligible experts masked, torch.topk, the unbiased scores of the picks, divided by their
    sum when renormalising, times scale. Equal scores come in torch.topk's (unspecified) order; the kernel puts the
    lower id first."""
    _check_options(logits.shape[1], k, score, n_group, topk_group, group_score)
    probs = _scores_ref(logits, score)  # [T, E]
    choice = probs if bias is None else probs + bias.float()
    if n_group > 1:
        T, E = choice.shape
        grouped = choice.view(T, n_group, E // n_group)
        per_group = grouped.max(-1).values if group_score == "max" else grouped.topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(per_group, dtype=torch.bool)
        keep.scatter_(1, torch.topk(per_group, topk_group, dim=-1).indices, True)  # [T, G]
        choice = choice.masked_fill(~keep.repeat_interleave(E // n_group, dim=1), float("-inf"))
    ids = torch.topk(choice, k, dim=-1).indices  # [T, K], descending
    weights = probs.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * scale, ids.to(torch.int32)


def _scores_ref(logits: torch.Tensor, score: str) -> torch.Tensor:
    """SCORES in fp32, as HF's routers compute them."""
    x = logits.float()
    if score == "sigmoid":
        return torch.sigmoid(x)
    if score == "sqrtsoftplus":
        return torch.nn.functional.softplus(x).sqrt()
    return torch.softmax(x, dim=-1)


def _check_picks(logits: torch.Tensor, ids: torch.Tensor, score: str) -> None:
    check_tensor(logits, "logits", 2)
    check_tensor(ids, "ids", 2, dtypes=(torch.int32, torch.int64))
    check_same_device(logits=logits, ids=ids)
    if score not in SCORES:
        raise ValueError(f"score: {score!r} is not one of {', '.join(SCORES)}")
    if ids.shape[0] != logits.shape[0] or logits.shape[1] > MAX_EXPERTS:
        raise ValueError(f"ids {tuple(ids.shape)}, logits {tuple(logits.shape)}: want one row of picks per token "
                         f"and at most {MAX_EXPERTS} experts")


def router_weights(logits: torch.Tensor, ids: torch.Tensor, renormalize: bool, score: str = "softmax",
                   scale: float = 1.0) -> torch.Tensor:
    """Picks given (hash routing: a table lookup of the token ids) -> their weights [T, K] fp32: the picks' scores
    of logits [T, E], divided by their sum when renormalising, times scale."""
    # 1. check
    _check_picks(logits, ids, score)
    T, E = logits.shape
    K = ids.shape[1]
    # 2. allocate
    weights = torch.empty((T, K), dtype=torch.float32, device=logits.device)
    if T == 0:
        return weights
    # 3. launch
    _router_weights_kernel[(T,)](logits, ids, weights, E, K, float(scale), logits.stride(0), ids.stride(0),
                                 weights.stride(0), RENORMALIZE=bool(renormalize), SCORE=score,
                                 BLOCK_E=triton.next_power_of_2(E), BLOCK_K=triton.next_power_of_2(K))
    return weights


def router_weights_ref(logits: torch.Tensor, ids: torch.Tensor, renormalize: bool, score: str = "softmax",
                       scale: float = 1.0) -> torch.Tensor:
    """HF's DeepseekV4HashRouter: the scores gathered at the given picks, over their sum (+ 1e-20), times scale."""
    _check_picks(logits, ids, score)
    weights = _scores_ref(logits, score).gather(1, ids.long())
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scale
