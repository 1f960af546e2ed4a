"""The gated delta rule over a prompt chunk, chunked (Gated DeltaNet prefill; HF's torch_chunk_gated_delta_rule).

Per value head h with key head h // (Hv / Hk), from a state S [Dk, Dv] (fp32), token by token:
    q, k <- l2norm(q), l2norm(k);  q <- q / sqrt(Dk)
    S <- exp(g_t) S;  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t
The kernel takes BT tokens at a time (WY form, as FLA and HF): within a chunk, with cumulative gates c,
    A = strictly_lower((beta k) k^T * exp(c_i - c_j)),  W = (I + A)^-1 (forward substitution, row by row)
    u = W (beta v),  w = W (beta k exp(c)),  v' = u - w S
    o = (q exp(c)) S + lower((q k^T) * exp(c_i - c_j)) v',  S <- exp(c_last) S + (k exp(c_last - c))^T v'
Lengths need not be a multiple of BT: the tail's missing rows load as zeros (gate 0, beta 0), which leaves S alone.
"""

from __future__ import annotations

import torch

from freetoken.kernels.checks import check_same_device, check_tensor
from freetoken.kernels.dot import mma
from freetoken.kernels.lazy import tl, triton

CHUNK = 16  # tokens per chunk: the forward substitution costs BT row steps per chunk
# TILES: value columns per program and warps, from ptxas -v on the sm_90a / sm_120a cubins at Dk = Dv = 128 (Qwen3-Next)
# (bytes of spill stores per thread). The state tile S [BK, BV] lives in registers, and fp32 `ieee` products run on
# FMA units: the former BV 64 / 4 warps / ieee spilled 16960 / 13506 B. bf16 / fp16 inputs now take tf32 products
# (tensor cores; their outputs round to 8 mantissa bits anyway) at BV 32 / 8 warps: 0 / 120 B; fp32 inputs keep
# ieee products at BV 16 / 8 warps: 432 / 416 B. A narrower BV means more programs, each repeating the BT x BT work.


@triton.jit
def _gated_delta_chunk_kernel(
    # Pointers
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, out_ptr,
    # Dimensions
    T, DK, DV, GROUP, scale,
    # Strides
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_gt, stride_bt,
    stride_sh, stride_sk, stride_ot, stride_oh,
    # Meta-parameters
    DOT_FP32: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    """One (value head, BV value columns) per program; S [BK, BV] stays in registers across the chunks."""
    h = tl.program_id(0)
    hk = h // GROUP
    rows = tl.arange(0, BT)
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(1) * BV + tl.arange(0, BV)
    mk, mv = offs_k < DK, offs_v < DV
    s_ptrs = state_ptr + h * stride_sh + offs_k[:, None] * stride_sk + offs_v[None, :]
    S = tl.load(s_ptrs, mask=mk[:, None] & mv[None, :], other=0.0).to(tl.float32)  # [BK, BV]
    lower = rows[:, None] >= rows[None, :]
    strict = rows[:, None] > rows[None, :]
    eye = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    for t0 in range(0, T, BT):
        t = t0 + rows
        mt = t < T
        q = tl.load(q_ptr + t[:, None] * stride_qt + hk * stride_qh + offs_k[None, :],
                    mask=mt[:, None] & mk[None, :], other=0.0).to(tl.float32)  # [BT, BK]
        k = tl.load(k_ptr + t[:, None] * stride_kt + hk * stride_kh + offs_k[None, :],
                    mask=mt[:, None] & mk[None, :], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + t[:, None] * stride_vt + h * stride_vh + offs_v[None, :],
                    mask=mt[:, None] & mv[None, :], other=0.0).to(tl.float32)  # [BT, BV]
        g = tl.load(g_ptr + t * stride_gt + h, mask=mt, other=0.0).to(tl.float32)  # [BT]
        beta = tl.load(beta_ptr + t * stride_bt + h, mask=mt, other=0.0).to(tl.float32)
        q = q * tl.rsqrt(tl.sum(q * q, 1) + 1e-6)[:, None] * scale
        k = k * tl.rsqrt(tl.sum(k * k, 1) + 1e-6)[:, None]
        c = tl.cumsum(g, 0)  # [BT] log of the decay since the chunk start
        decay = tl.exp(tl.where(lower, c[:, None] - c[None, :], float("-inf")))  # [BT, BT], 0 above the diagonal
        kb = k * beta[:, None]
        A = tl.where(strict, mma(kb, tl.trans(k), tl.zeros((BT, BT), tl.float32), DOT_FP32) * decay, 0.0)
        W = eye  # (I + A)^-1: row i = e_i - sum_{j < i} A[i, j] W[j]
        for i in range(1, BT):
            a_i = tl.sum(tl.where(rows[:, None] == i, A, 0.0), 0)  # [BT] row i of A
            W = W - tl.where(rows[:, None] == i, tl.sum(a_i[:, None] * W, 0)[None, :], 0.0)
        u = mma(W, v * beta[:, None], tl.zeros((BT, BV), tl.float32), DOT_FP32)
        w = mma(W, kb * tl.exp(c)[:, None], tl.zeros((BT, BK), tl.float32), DOT_FP32)
        v_new = u - mma(w, S, tl.zeros((BT, BV), tl.float32), DOT_FP32)  # [BT, BV]
        attn = mma(q, tl.trans(k), tl.zeros((BT, BT), tl.float32), DOT_FP32) * decay
        o = mma(q * tl.exp(c)[:, None], S, tl.zeros((BT, BV), tl.float32), DOT_FP32)
        o = mma(attn, v_new, o, DOT_FP32)
        tl.store(out_ptr + t[:, None] * stride_ot + h * stride_oh + offs_v[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=mt[:, None] & mv[None, :])
        c_last = tl.sum(tl.where(rows == BT - 1, c, 0.0), 0)  # the tail's zero gates keep the last real value
        S = S * tl.exp(c_last) + mma(tl.trans(k * tl.exp(c_last - c)[:, None]), v_new,
                                     tl.zeros((BK, BV), tl.float32), DOT_FP32)
    tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=mk[:, None] & mv[None, :])


def check_delta_args(q, k, v, g, beta, state) -> None:
    """q, k [T, Hk, Dk]; v [T, Hv, Dv]; g, beta [T, Hv]; state [Hv, Dk, Dv] fp32; Hv a multiple of Hk."""
    for t, name, ndim in ((q, "q", 3), (k, "k", 3), (v, "v", 3), (g, "g", 2), (beta, "beta", 2)):
        check_tensor(t, name, ndim)
    check_tensor(state, "state", 3, dtypes=(torch.float32,))
    check_same_device(q=q, k=k, v=v, g=g, beta=beta, state=state)
    T, Hk, Dk = q.shape
    Hv, Dv = v.shape[1:]
    if (tuple(k.shape) != (T, Hk, Dk) or v.shape[0] != T or tuple(g.shape) != (T, Hv)
            or tuple(beta.shape) != (T, Hv) or tuple(state.shape) != (Hv, Dk, Dv) or Hv % Hk):
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, g {tuple(g.shape)}, beta "
                         f"{tuple(beta.shape)}, state {tuple(state.shape)}: want q, k [T, Hk, Dk], v [T, Hv, Dv], "
                         f"g, beta [T, Hv], state [Hv, Dk, Dv] with Hv a multiple of Hk")
    if not state.is_contiguous():
        raise ValueError("state: must be contiguous")


def gated_delta_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                      state: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """q, k [T, Hk, Dk], v [T, Hv, Dv], g (log decay, <= 0) and beta [T, Hv], state [Hv, Dk, Dv] fp32 (updated in
    place) -> out [T, Hv, Dv] in v's dtype. The in-kernel operands are fp32 either way (the interpreter's bf16 dot
    issue does not arise); only the product precision follows the inputs' dtype."""
    # 1. check
    check_delta_args(q, k, v, g, beta, state)
    T, Hk, Dk = q.shape
    Hv, Dv = v.shape[1:]
    if chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two >= 16, got {chunk}")
    # 2. allocate
    out = torch.empty((T, Hv, Dv), dtype=v.dtype, device=v.device)
    if T == 0:
        return out
    # 3. launch
    dot_fp32 = torch.float32 in (q.dtype, k.dtype, v.dtype)  # fp32 inputs: fp32 products; else tf32 (tensor cores)
    BK = max(triton.next_power_of_2(Dk), 16)
    BV = min(max(triton.next_power_of_2(Dv), 16), 16 if dot_fp32 else 32)  # see TILES
    grid = (Hv, triton.cdiv(Dv, BV))
    _gated_delta_chunk_kernel[grid](
        q, k, v, g, beta, state, out, T, Dk, Dv, Hv // Hk, Dk ** -0.5,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), beta.stride(0),
        state.stride(0), state.stride(1), out.stride(0), out.stride(1), DOT_FP32=dot_fp32, BT=chunk, BK=BK, BV=BV,
        num_warps=8)
    return out


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum x^2 + 1e-6) over the last dim, in fp32 (FLA's and HF's l2norm)."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def gated_delta_chunk_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                          state: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """torch, the same chunked algorithm with a triangular solve (vectorised over heads): the CPU engine's prefill."""
    check_delta_args(q, k, v, g, beta, state)
    T, Hk, Dk = q.shape
    Hv, Dv = v.shape[1:]
    rep = Hv // Hk
    pad = (-T) % chunk
    N = (T + pad) // chunk

    def heads_first(x: torch.Tensor) -> torch.Tensor:  # [T, H, ...] -> [H, N, chunk, ...] fp32, zero-padded
        # one strided, converting copy (float() then pad() took two, and pad's is slow: 22% of a 512-token call)
        out = torch.empty((x.shape[1], T + pad, *x.shape[2:]), dtype=torch.float32, device=x.device)
        out[:, :T].copy_(x.movedim(0, 1))
        out[:, T:].zero_()
        return out.view(x.shape[1], N, chunk, *x.shape[2:])

    qh = heads_first(l2norm(q).repeat_interleave(rep, 1)) * Dk ** -0.5  # [Hv, N, BT, Dk]
    kh = heads_first(l2norm(k).repeat_interleave(rep, 1))
    vh, gh, bh = heads_first(v), heads_first(g), heads_first(beta)  # [Hv, N, BT, Dv], [Hv, N, BT]
    c = gh.cumsum(-1)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = (c[..., :, None] - c[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # [Hv, N, BT, BT]
    kb = kh * bh[..., None]
    A = (kb @ kh.transpose(-1, -2)) * decay
    u = torch.linalg.solve_triangular(A, vh * bh[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(A, kb * c.exp()[..., None], upper=False, unitriangular=True)
    attn = (qh @ kh.transpose(-1, -2)) * decay
    # every chunk's decays at once (the loop then runs 5 products per chunk): q decayed from the chunk's start, k to
    # its end, the state across it
    c_last = c[..., -1:]  # [Hv, N, 1]
    q_decayed = qh * c.exp()[..., None]  # [Hv, N, BT, Dk]
    k_to_end = (kh * (c_last - c).exp()[..., None]).transpose(-1, -2)  # [Hv, N, Dk, BT]
    state_decay = c_last.exp()[..., None]  # [Hv, N, 1, 1]
    out = torch.empty_like(vh)
    S = state.float()
    for n in range(N):
        v_new = u[:, n] - w[:, n] @ S
        out[:, n] = q_decayed[:, n] @ S + attn[:, n] @ v_new
        S = S * state_decay[:, n] + k_to_end[:, n] @ v_new
    state.copy_(S)
    return out.reshape(Hv, N * chunk, Dv)[:, :T].movedim(0, 1).to(v.dtype)
