"""The gated delta rule token by token (Gated DeltaNet decode; HF's torch_recurrent_gated_delta_rule).

Per value head h (key head h // (Hv / Hk)), state S [Dk, Dv] fp32, for each token:
    S <- exp(g) S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q     (q, k l2-normalised, q / sqrt(Dk))

One sequence: T tokens in order over state [Hv, Dk, Dv]. A decode batch: state [B, Hv, Dk, Dv] (a row per sequence,
stacked by the caller) and T = B tokens, token b the next one of sequence b.
"""

from __future__ import annotations

import torch

from freetoken.kernels.gated_delta_chunk import check_delta_args, l2norm
from freetoken.kernels.lazy import tl, triton


@triton.jit
def _gated_delta_step_kernel(
    # Pointers
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, out_ptr,
    # Dimensions
    T, DK, DV, GROUP, scale,
    # Strides
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_gt, stride_bt,
    stride_sb, stride_sh, stride_sk, stride_ot, stride_oh,
    # Meta-parameters
    BK: tl.constexpr, BV: tl.constexpr,
):
    """One (sequence, value head, BV value columns) per program; S [BK, BV] read once, written once. Sequence b
    owns tokens [b T, (b + 1) T)."""
    h = tl.program_id(0)
    b = tl.program_id(2)
    hk = h // GROUP
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(1) * BV + tl.arange(0, BV)
    mk, mv = offs_k < DK, offs_v < DV
    s_ptrs = state_ptr + b * stride_sb + h * stride_sh + offs_k[:, None] * stride_sk + offs_v[None, :]
    S = tl.load(s_ptrs, mask=mk[:, None] & mv[None, :], other=0.0).to(tl.float32)
    for i in range(0, T):
        t = b * T + i
        q = tl.load(q_ptr + t * stride_qt + hk * stride_qh + offs_k, mask=mk, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + t * stride_kt + hk * stride_kh + offs_k, mask=mk, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + t * stride_vt + h * stride_vh + offs_v, mask=mv, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + t * stride_gt + h).to(tl.float32)
        beta = tl.load(beta_ptr + t * stride_bt + h).to(tl.float32)
        q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6) * scale
        k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
        S = S * tl.exp(g)
        delta = (v - tl.sum(S * k[:, None], 0)) * beta  # [BV]
        S = S + k[:, None] * delta[None, :]
        o = tl.sum(S * q[:, None], 0)
        tl.store(out_ptr + t * stride_ot + h * stride_oh + offs_v, o.to(out_ptr.dtype.element_ty), mask=mv)
    tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=mk[:, None] & mv[None, :])


def _states(q: torch.Tensor, k, v, g, beta, state: torch.Tensor) -> torch.Tensor:
    """Checks the arguments -> the state as [B, Hv, Dk, Dv] (B = 1 for one sequence's [Hv, Dk, Dv])."""
    if state.dim() == 4:
        if state.shape[0] != q.shape[0]:
            raise ValueError(f"state {tuple(state.shape)}: a batch of {state.shape[0]} sequences needs one token "
                             f"each, got {q.shape[0]}")
        if state.shape[0]:  # each sequence's one token against its own state: the shapes of one
            check_delta_args(q[:1], k[:1], v[:1], g[:1], beta[:1], state[0])
        if not state.is_contiguous():
            raise ValueError("state: must be contiguous")
        return state
    check_delta_args(q, k, v, g, beta, state)
    return state[None]


def gated_delta_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     state: torch.Tensor) -> torch.Tensor:
    """As gated_delta_chunk (same shapes, state updated in place), one token after another: decode's T = 1; or a
    decode batch, state [B, Hv, Dk, Dv] and token b of q, k, v, g, beta sequence b's."""
    # 1. check
    states = _states(q, k, v, g, beta, state)
    B = states.shape[0]
    T, Hk, Dk = q.shape
    Hv, Dv = v.shape[1:]
    # 2. allocate
    out = torch.empty((T, Hv, Dv), dtype=v.dtype, device=v.device)
    if T == 0:
        return out
    # 3. launch
    BK = triton.next_power_of_2(Dk)
    BV = min(triton.next_power_of_2(Dv), 64)
    _gated_delta_step_kernel[(Hv, triton.cdiv(Dv, BV), B)](
        q, k, v, g, beta, states, out, T // B, Dk, Dv, Hv // Hk, Dk ** -0.5,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), beta.stride(0),
        states.stride(0), states.stride(1), states.stride(2), out.stride(0), out.stride(1), BK=BK, BV=BV)
    return out


def gated_delta_step_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                         state: torch.Tensor) -> torch.Tensor:
    """torch, the recurrence as written above: all heads (and a decode batch's sequences) at once, the state updated
    in place by batched matrix products, one pass over it each (HF's elementwise products and sums made four
    state-sized temporaries: 2.5 -> 0.37 ms a token for 32 heads of 128 x 128 on 2 cores; equal to fp32 rounding)."""
    states = _states(q, k, v, g, beta, state)  # [B, Hv, Dk, Dv]
    T, Hk, Dk = q.shape
    B, Hv, _, Dv = states.shape
    rep = Hv // Hk
    qf = l2norm(q).repeat_interleave(rep, 1) * Dk ** -0.5  # [T, Hv, Dk]
    kf = l2norm(k).repeat_interleave(rep, 1)
    decay, b, vf = g.float().exp(), beta.float(), v.float()  # [T, Hv], [T, Hv], [T, Hv, Dv]
    S = states if states.is_contiguous() else states.contiguous()
    if state.dim() == 4:  # a decode batch: token t is sequence t's, one step over every (sequence, head) at once
        out = _step(S.view(B * Hv, Dk, Dv), qf.reshape(-1, Dk), kf.reshape(-1, Dk), vf.reshape(-1, Dv),
                    decay.reshape(-1), b.reshape(-1)).view(T, Hv, Dv)
    else:
        out = torch.stack([_step(S[0], qf[t], kf[t], vf[t], decay[t], b[t]) for t in range(T)]) if T else vf
    if S is not states:
        states.copy_(S)
    return out.to(v.dtype)


def _step(S: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, decay: torch.Tensor,
          beta: torch.Tensor) -> torch.Tensor:
    """One token over N heads: S [N, Dk, Dv] in place; q, k [N, Dk], v [N, Dv], decay, beta [N] -> o [N, Dv]."""
    S.mul_(decay[:, None, None])
    delta = (v - torch.bmm(k[:, None, :], S)[:, 0]) * beta[:, None]  # [N, Dv]
    S.baddbmm_(k[:, :, None], delta[:, None, :])
    return torch.bmm(q[:, None, :], S)[:, 0]
