"""DeepSeek-V4's manifold-constrained hyper-connections (mHC): the residual is N streams x [T, N, D]. Around each
attention and MoE block, one token's streams give (flattened, RMS-normalised without a weight, projected by fn
[(2 + N) N, N D]) three sets of weights:

    pre  = sigmoid(mix_pre  * scale[0] + base_pre) + hc_eps                     [N]    collapses the streams: the
                                                                                        block's input sum_n pre_n x_n
    post = 2 sigmoid(mix_post * scale[1] + base_post)                          [N]    spreads the block's output y
    comb = Sinkhorn(softmax_rows(mix_comb * scale[2] + base_comb) + hc_eps)     [N, N] mixes the streams

Sinkhorn-Knopp: columns normalised, then `iters - 1` rounds of rows then columns (each sum + hc_eps), as HF's
DeepseekV4HyperConnection. After the block: x'_n = post_n y + sum_j comb[j, n] x_j (hc_post). The final head
(hc_head) collapses the streams with pre = sigmoid(mix * scale + base) + hc_eps alone (fn [N, N D]).
"""

from __future__ import annotations

import numpy as np
import torch

from freetoken.kernels.checks import check_same_device, check_tensor
from freetoken.kernels.lazy import tl, triton


@triton.jit
def _pick(mixes, offs_m, offs_n, lo):
    """mixes[lo + n] for n in [0, NP) (0 past the vector)."""
    return tl.sum(tl.where(offs_m[None, :] == lo + offs_n[:, None], mixes[None, :], 0.0), axis=1)


@triton.jit
def _hc_pre_kernel(
    # Pointers
    x_ptr, fn_ptr, base_ptr, scale_ptr, post_ptr, comb_ptr, out_ptr,
    # Dimensions
    D, M, eps, hc_eps, iters,
    # Strides
    stride_xt, stride_fm, stride_pt, stride_ct, stride_ot,
    # Meta-parameters
    N: tl.constexpr, NP: tl.constexpr, MP: tl.constexpr, HEAD: tl.constexpr, BLOCK: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One token per program: the projection and the norm's sum of squares in one pass over its N D values, the
    weights in registers, then the collapse."""
    t = tl.program_id(0)
    offs_m = tl.arange(0, MP)
    offs_n = tl.arange(0, NP)
    mm, nmask = offs_m < M, offs_n < N
    acc = tl.zeros([MP], dtype=tl.float32)
    sq = tl.zeros([BLOCK], dtype=tl.float32)
    x_row = x_ptr + t * stride_xt
    for k0 in range(0, N * D, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        xv = tl.load(x_row + offs, mask=offs < N * D, other=0.0).to(tl.float32)
        sq += xv * xv
        w = tl.load(fn_ptr + offs_m[:, None] * stride_fm + offs[None, :], mask=mm[:, None] & (offs[None, :] < N * D),
                    other=0.0).to(tl.float32)
        acc += tl.sum(w * xv[None, :], axis=1)
    mixes = acc * tl.rsqrt(tl.sum(sq, axis=0) / (N * D) + eps)  # [MP]
    s0 = tl.load(scale_ptr).to(tl.float32)
    pre = tl.sigmoid(_pick(mixes, offs_m, offs_n, 0) * s0 + tl.load(base_ptr + offs_n, mask=nmask, other=0.0)) + hc_eps
    pre = tl.where(nmask, pre, 0.0)  # [NP]
    if not HEAD:
        s1 = tl.load(scale_ptr + 1).to(tl.float32)
        s2 = tl.load(scale_ptr + 2).to(tl.float32)
        post = 2.0 * tl.sigmoid(_pick(mixes, offs_m, offs_n, N) * s1
                                + tl.load(base_ptr + N + offs_n, mask=nmask, other=0.0))
        tl.store(post_ptr + t * stride_pt + offs_n, post, mask=nmask)
        cell = offs_n[:, None] * N + offs_n[None, :]  # [NP, NP] row i, column j
        cmask = nmask[:, None] & nmask[None, :]
        raw = tl.sum(tl.where(offs_m[None, None, :] == 2 * N + cell[:, :, None], mixes[None, None, :], 0.0), axis=2)
        logits = tl.where(cmask, raw * s2 + tl.load(base_ptr + 2 * N + cell, mask=cmask, other=0.0), -float("inf"))
        top = tl.max(logits, axis=1)
        e = tl.exp(logits - tl.where(nmask, top, 0.0)[:, None])  # padding rows: exp(-inf) = 0, never NaN
        den = tl.sum(e, axis=1)
        comb = tl.where(cmask, e / tl.where(nmask, den, 1.0)[:, None] + hc_eps, 0.0)
        comb = comb / (tl.sum(comb, axis=0)[None, :] + hc_eps)
        for _ in range(iters - 1):
            comb = comb / (tl.sum(comb, axis=1)[:, None] + hc_eps)
            comb = comb / (tl.sum(comb, axis=0)[None, :] + hc_eps)
        tl.store(comb_ptr + t * stride_ct + cell, comb, mask=cmask)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        xs = tl.load(x_row + offs_n[:, None] * D + offs_d[None, :], mask=nmask[:, None] & (offs_d[None, :] < D),
                     other=0.0).to(tl.float32)  # [NP, BD]
        tl.store(out_ptr + t * stride_ot + offs_d, tl.sum(pre[:, None] * xs, axis=0).to(out_ptr.dtype.element_ty),
                 mask=offs_d < D)


@triton.jit
def _hc_post_kernel(
    # Pointers
    x_ptr, y_ptr, post_ptr, comb_ptr, out_ptr,
    # Dimensions
    D,
    # Strides
    stride_xt, stride_yt, stride_pt, stride_ct, stride_ot,
    # Meta-parameters
    N: tl.constexpr, NP: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Program (token, D tile): out[n] = post[n] y + sum_j comb[j, n] x[j]."""
    t = tl.program_id(0)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, NP)
    nmask, dmask = offs_n < N, offs_d < D
    xs = tl.load(x_ptr + t * stride_xt + offs_n[:, None] * D + offs_d[None, :], mask=nmask[:, None] & dmask[None, :],
                 other=0.0).to(tl.float32)  # [NP j, BD]
    comb = tl.load(comb_ptr + t * stride_ct + offs_n[:, None] * N + offs_n[None, :],
                   mask=nmask[:, None] & nmask[None, :], other=0.0)  # [NP j, NP n]
    mixed = tl.sum(comb[:, :, None] * xs[:, None, :], axis=0)  # [NP n, BD]
    y = tl.load(y_ptr + t * stride_yt + offs_d, mask=dmask, other=0.0).to(tl.float32)
    post = tl.load(post_ptr + t * stride_pt + offs_n, mask=nmask, other=0.0)
    out = post[:, None] * y[None, :] + mixed
    tl.store(out_ptr + t * stride_ot + offs_n[:, None] * D + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=nmask[:, None] & dmask[None, :])


def _check(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, head: bool) -> None:
    check_tensor(x, "x", 3)
    for t, name, ndim in ((fn, "fn", 2), (base, "base", 1), (scale, "scale", 1)):
        check_tensor(t, name, ndim, dtypes=(torch.float32,))
    check_same_device(x=x, fn=fn, base=base, scale=scale)
    T, N, D = x.shape
    M = N if head else (2 + N) * N
    if tuple(fn.shape) != (M, N * D) or base.shape[0] != M or scale.shape[0] != (1 if head else 3):
        raise ValueError(f"x {tuple(x.shape)}, fn {tuple(fn.shape)}, base {tuple(base.shape)}, scale "
                         f"{tuple(scale.shape)}: want fn [{M}, {N * D}], base [{M}], scale [{1 if head else 3}]")
    if not x.is_contiguous():
        raise ValueError("x: the streams must be contiguous [T, N, D]")


def hc_pre(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, eps: float, hc_eps: float,
           iters: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, N, D] -> (post [T, N] fp32, comb [T, N, N] fp32, the collapsed block input [T, D] in x's dtype)."""
    # 1. check
    _check(x, fn, base, scale, head=False)
    if iters < 1:
        raise ValueError(f"iters: {iters} Sinkhorn iterations, want at least 1")
    T, N, D = x.shape
    # 2. allocate
    post = torch.empty((T, N), dtype=torch.float32, device=x.device)
    comb = torch.empty((T, N, N), dtype=torch.float32, device=x.device)
    out = torch.empty((T, D), dtype=x.dtype, device=x.device)
    # 3. launch
    if T:
        _launch_pre(x, fn, base, scale, post, comb, out, eps, hc_eps, iters, head=False)
    return post, comb, out


def hc_head(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, eps: float,
            hc_eps: float) -> torch.Tensor:
    """The final collapse: x [T, N, D], fn [N, N D], base [N], scale [1] -> [T, D] in x's dtype."""
    _check(x, fn, base, scale, head=True)
    T, N, D = x.shape
    out = torch.empty((T, D), dtype=x.dtype, device=x.device)
    if T:
        _launch_pre(x, fn, base, scale, out, out, out, eps, hc_eps, 1, head=True)
    return out


def _launch_pre(x, fn, base, scale, post, comb, out, eps, hc_eps, iters, head: bool) -> None:
    T, N, D = x.shape
    M = fn.shape[0]
    _hc_pre_kernel[(T,)](
        x, fn, base, scale, post, comb, out, D, M, float(eps), float(hc_eps), int(iters),
        x.stride(0), fn.stride(0), post.stride(0), 0 if head else comb.stride(0), out.stride(0),
        N=N, NP=triton.next_power_of_2(N), MP=triton.next_power_of_2(M), HEAD=head,
        BLOCK=min(triton.next_power_of_2(N * D), 1024), BLOCK_D=min(triton.next_power_of_2(D), 256))


def hc_post(x: torch.Tensor, y: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """x [T, N, D] streams, y [T, D] the block's output, post [T, N], comb [T, N, N] -> the new streams [T, N, D]."""
    # 1. check
    check_tensor(x, "x", 3)
    check_tensor(y, "y", 2)
    check_tensor(post, "post", 2, dtypes=(torch.float32,))
    check_tensor(comb, "comb", 3, dtypes=(torch.float32,))
    check_same_device(x=x, y=y, post=post, comb=comb)
    T, N, D = x.shape
    if tuple(y.shape) != (T, D) or tuple(post.shape) != (T, N) or tuple(comb.shape) != (T, N, N) \
            or not (x.is_contiguous() and comb.is_contiguous()):
        raise ValueError(f"x {tuple(x.shape)}, y {tuple(y.shape)}, post {tuple(post.shape)}, comb "
                         f"{tuple(comb.shape)}: want contiguous x [T, N, D], y [T, D], post [T, N], comb [T, N, N]")
    # 2. allocate
    out = torch.empty_like(x)
    # 3. launch
    BLOCK_D = min(triton.next_power_of_2(D), 128)
    if T:
        _hc_post_kernel[(T, triton.cdiv(D, BLOCK_D))](
            x, y, post, comb, out, D, x.stride(0), y.stride(0), post.stride(0), comb.stride(0), out.stride(0),
            N=N, NP=triton.next_power_of_2(N), BLOCK_D=BLOCK_D)
    return out


# torch references, written as HF's DeepseekV4HyperConnection / DeepseekV4HyperHead / DeepseekV4DecoderLayer
def _mixes(x: torch.Tensor, fn: torch.Tensor, eps: float) -> torch.Tensor:
    flat = x.reshape(x.shape[0], -1).float()
    flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + eps)
    return torch.nn.functional.linear(flat, fn.float())


HC_BLOCK_TOKENS = 128  # a long prefill's references run in blocks of this many tokens (see token_blocks)


def token_blocks(T: int) -> list[slice]:
    """The references work token by token, so a long prefill runs them a block at a time: whole, their [T, N D] fp32
    temporaries (128 MB at 2,048 tokens of D = 4,096) exceed glibc's mmap ceiling, so every call faults in fresh
    pages. One core, bf16, T = 2,048, D = 4,096: hc_pre 487 -> 90 ms, hc_post 165 -> 86, hc_head 466 -> 53; the
    results bitwise equal."""
    return [slice(i, min(T, i + HC_BLOCK_TOKENS)) for i in range(0, T, HC_BLOCK_TOKENS)]


def hc_pre_ref(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, eps: float,
               hc_eps: float, iters: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check(x, fn, base, scale, head=False)
    if x.shape[0] > HC_BLOCK_TOKENS:
        parts = [_hc_pre(x[b], fn, base, scale, eps, hc_eps, iters) for b in token_blocks(x.shape[0])]
        return tuple(torch.cat(p) for p in zip(*parts))
    return _hc_pre(x, fn, base, scale, eps, hc_eps, iters)


def _hc_pre(x, fn, base, scale, eps, hc_eps, iters):
    N = x.shape[1]
    pre_w, post_w, comb_w = _mixes(x, fn, eps).split([N, N, N * N], dim=-1)
    pre_b, post_b, comb_b = base.split([N, N, N * N])
    pre = torch.sigmoid(pre_w * scale[0] + pre_b) + hc_eps
    post = 2 * torch.sigmoid(post_w * scale[1] + post_b)
    comb = torch.softmax(comb_w.view(-1, N, N) * scale[2] + comb_b.view(N, N), dim=-1) + hc_eps
    return post, sinkhorn(comb, hc_eps, iters), (pre.unsqueeze(-1) * x).sum(dim=1).to(x.dtype)


SINKHORN_NUMPY_TOKENS = 32  # up to this many tokens a CPU Sinkhorn runs in numpy (equal near 64, torch ahead at 128)


def sinkhorn(comb: torch.Tensor, hc_eps: float, iters: int) -> torch.Tensor:
    """comb [T, N, N] fp32: columns normalised, then iters - 1 rounds of rows then columns (each sum + hc_eps). A
    decode step runs 6 iters - 3 operations on 4 x 4 matrices twice per layer: on a CPU numpy does each in ~1.3 us
    against torch's ~3 us of dispatch (the same fp32 sums and divisions, bitwise equal wherever compared; one token,
    20 iters, one core: 361 -> 146 us)."""
    in_numpy = comb.device.type == "cpu" and not comb.requires_grad and comb.shape[0] <= SINKHORN_NUMPY_TOKENS
    c, eps = (comb.numpy(), np.float32(hc_eps)) if in_numpy else (comb, hc_eps)  # (torch takes numpy's axis words)
    c = c / (c.sum(axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(axis=-1, keepdims=True) + eps)
        c = c / (c.sum(axis=-2, keepdims=True) + eps)
    return torch.from_numpy(c) if in_numpy else c


def hc_head_ref(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, eps: float,
                hc_eps: float) -> torch.Tensor:
    _check(x, fn, base, scale, head=True)
    if x.shape[0] > HC_BLOCK_TOKENS:
        return torch.cat([_hc_head(x[b], fn, base, scale, eps, hc_eps) for b in token_blocks(x.shape[0])])
    return _hc_head(x, fn, base, scale, eps, hc_eps)


def _hc_head(x, fn, base, scale, eps, hc_eps):
    pre = torch.sigmoid(_mixes(x, fn, eps) * scale.float() + base.float()) + hc_eps
    return (pre.unsqueeze(-1) * x).sum(dim=1).to(x.dtype)


def hc_post_ref(x: torch.Tensor, y: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    if x.shape[0] <= HC_BLOCK_TOKENS:
        return _hc_post(x, y, post, comb)
    out = torch.empty(x.shape, dtype=torch.result_type(x, y), device=x.device)  # [T, N, D]
    for b in token_blocks(x.shape[0]):
        out[b] = _hc_post(x[b], y[b], post[b], comb[b])
    return out


def _hc_post(x, y, post, comb):
    dtype = x.dtype
    return post.to(dtype).unsqueeze(-1) * y.unsqueeze(-2) + torch.matmul(comb.to(dtype).transpose(-1, -2), x)
