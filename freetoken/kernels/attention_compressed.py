"""DeepSeek-V4's attention: every query head of a token over one shared key/value head (K = V), the keys of a sliding
window of the cache plus compressed entries the caller picks per query, a learned sink logit per head.

query t (position p = start_pos + t) sees cache rows (p - window, p] and the entries `picks[t]` names (-1: none);
softmax over those logits and the head's sink (value 0); the output is the softmax-weighted sum of the same rows.
"""

from __future__ import annotations

import torch

from freetoken.kernels.checks import check_same_device, check_tensor, dot_in_fp32
from freetoken.kernels.dot import mma
from freetoken.kernels.lazy import tl, triton

LOG2E = 1.4426950408889634


@triton.jit
def _online_step(q, k, visible, m_i, l_i, acc, qk_scale, DOT_FP32: tl.constexpr, BLOCK_H: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """One block of keys k [BN, BD] (K = V) for queries q [BH, BD]: the online softmax (base 2) update; the
    probabilities meet the values in the values' dtype, as the other attention kernels do."""
    s = mma(q, tl.trans(k), tl.zeros([BLOCK_H, BLOCK_N], dtype=tl.float32), DOT_FP32) * qk_scale  # [BH, BN]
    s = tl.where(visible[None, :], s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = mma(p.to(k.dtype), k, acc * alpha[:, None], DOT_FP32)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["start_pos"])
def _attention_compressed_kernel(
    # Pointers
    q_ptr, k_ptr, e_ptr, picks_ptr, sinks_ptr, out_ptr,
    # Dimensions
    start_pos, H, Dh, P, window, qk_scale,
    # Strides
    stride_qt, stride_qh, stride_ks, stride_es, stride_pt, stride_ot, stride_oh,
    # Meta-parameters
    DOT_FP32: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Program (query, head block): starts every row at the sink (m = sink, l = 1), then the window's keys, then
    the picked entries, in blocks of BLOCK_N."""
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    hmask, dmask = offs_h < H, offs_d < Dh
    q = tl.load(q_ptr + t * stride_qt + offs_h[:, None] * stride_qh + offs_d[None, :],
                mask=hmask[:, None] & dmask[None, :], other=0.0)
    m_i = tl.load(sinks_ptr + offs_h, mask=hmask, other=0.0).to(tl.float32) * 1.4426950408889634
    l_i = tl.full([BLOCK_H], 1.0, dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    pos = start_pos + t
    lo = tl.maximum(pos - window + 1, 0)
    for n0 in range(lo, pos + 1, BLOCK_N):  # the sliding window of the cache
        offs_n = n0 + tl.arange(0, BLOCK_N)
        visible = offs_n <= pos
        k = tl.load(k_ptr + offs_n[:, None] * stride_ks + offs_d[None, :], mask=visible[:, None] & dmask[None, :],
                    other=0.0)
        m_i, l_i, acc = _online_step(q, k, visible, m_i, l_i, acc, qk_scale, DOT_FP32, BLOCK_H, BLOCK_N)
    for j0 in range(0, P, BLOCK_N):  # the compressed entries picked for this query
        offs_j = j0 + tl.arange(0, BLOCK_N)
        ids = tl.load(picks_ptr + t * stride_pt + offs_j, mask=offs_j < P, other=-1)
        visible = ids >= 0
        k = tl.load(e_ptr + ids[:, None].to(tl.int64) * stride_es + offs_d[None, :],
                    mask=visible[:, None] & dmask[None, :], other=0.0)
        m_i, l_i, acc = _online_step(q, k, visible, m_i, l_i, acc, qk_scale, DOT_FP32, BLOCK_H, BLOCK_N)
    out = acc / l_i[:, None]
    tl.store(out_ptr + t * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=hmask[:, None] & dmask[None, :])


def _check(q: torch.Tensor, kv: torch.Tensor, entries: torch.Tensor, picks: torch.Tensor, start_pos: int,
           window: int, sinks: torch.Tensor) -> None:
    check_tensor(q, "q", 3)
    check_tensor(kv, "kv", 2)
    check_tensor(entries, "entries", 2)
    check_tensor(picks, "picks", 2, dtypes=(torch.int32, torch.int64))
    check_tensor(sinks, "sinks", 1, dtypes=(torch.float32,))
    check_same_device(q=q, kv=kv, entries=entries, picks=picks, sinks=sinks)
    T, H, Dh = q.shape
    if kv.shape[1] != Dh or entries.shape[1] != Dh or picks.shape[0] != T or sinks.shape[0] != H:
        raise ValueError(f"q {tuple(q.shape)}, kv {tuple(kv.shape)}, entries {tuple(entries.shape)}, picks "
                         f"{tuple(picks.shape)}, sinks {tuple(sinks.shape)}: want q [T, H, Dh], kv [S, Dh], entries "
                         "[C, Dh], picks [T, P], sinks [H]")
    if start_pos < 0 or start_pos + T > kv.shape[0] or window < 1:
        raise ValueError(f"start_pos {start_pos} + {T} queries must fit the cache's {kv.shape[0]} rows and window "
                         f"{window} be positive")


def attention_compressed(q: torch.Tensor, kv: torch.Tensor, entries: torch.Tensor, picks: torch.Tensor,
                         start_pos: int, window: int, sinks: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """q [T, H, Dh] at positions start_pos.., kv [S, Dh] the cache (K = V), entries [C, Dh], picks [T, P] entry ids
    per query (-1: none), sinks [H] fp32 -> [T, H, Dh] in q's dtype."""
    # 1. check
    _check(q, kv, entries, picks, start_pos, window, sinks)
    T, H, Dh = q.shape
    # 2. allocate
    out = torch.empty_like(q)
    if T == 0:
        return out
    # 3. launch
    BLOCK_D = max(triton.next_power_of_2(Dh), 16)
    BLOCK_H = 16 if H <= 16 else 32
    BLOCK_N = 32 if BLOCK_D <= 256 else 16
    picks = picks.to(torch.int32)
    _attention_compressed_kernel[(T, triton.cdiv(H, BLOCK_H))](
        q, kv, entries, picks, sinks, out, start_pos, H, Dh, picks.shape[1], int(window), sm_scale * LOG2E,
        q.stride(0), q.stride(1), kv.stride(0), entries.stride(0), picks.stride(0), out.stride(0), out.stride(1),
        DOT_FP32=dot_in_fp32(q, kv, entries), BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D)
    return out


def attention_compressed_ref(q: torch.Tensor, kv: torch.Tensor, entries: torch.Tensor, picks: torch.Tensor,
                             start_pos: int, window: int, sinks: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """torch in fp32, all queries at once: logits over the rows any query's window covers (masked to each query's
    own) and over each query's gathered entries, the sink joined to the softmax (its probability dropped), the
    weighted sum of the same rows and entries."""
    _check(q, kv, entries, picks, start_pos, window, sinks)
    # T = queries, H = heads, L = rows some window covers, P = picks per query, Dh = head dim
    T, H, Dh = q.shape
    lo = max(start_pos - window + 1, 0)
    rows = kv[lo:start_pos + T].float()  # [L, Dh]
    pos = start_pos + torch.arange(T, device=q.device)[:, None]  # [T, 1]
    row_pos = lo + torch.arange(rows.shape[0], device=q.device)[None, :]  # [1, L]
    seen = (row_pos <= pos) & (row_pos > pos - window)  # [T, L]
    picked = entries.float()[picks.clamp(min=0).long()]  # [T, P, Dh]
    qf = q.float()
    logits = torch.cat([torch.einsum("thd,ld->thl", qf, rows).masked_fill(~seen[:, None], float("-inf")),
                        torch.einsum("thd,tpd->thp", qf, picked).masked_fill((picks < 0)[:, None], float("-inf"))],
                       dim=-1) * sm_scale  # [T, H, L + P]
    sink = sinks.float()[None, :, None].expand(T, H, 1)
    probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
    out = torch.einsum("thl,ld->thd", probs[..., :rows.shape[0]], rows) + \
        torch.einsum("thp,tpd->thd", probs[..., rows.shape[0]:], picked)
    return out.to(q.dtype)
