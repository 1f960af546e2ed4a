"""Causal GQA attention over a contiguous KV cache: query i sits at position start_pos + i and sees keys [0, start_pos + i].

The caller has already written this call's K/V at [start_pos, start_pos + T). Prefill (T > 1) runs a flash-attention
kernel (attention_prefill.py), decode (T = 1) a split-K kernel plus a merge (attention_decode.py).
Options (gpt-oss): `sinks` [H], a learned logit per head that joins the softmax denominator with value 0; `window`,
a sliding window: query p sees keys (p - window, p] only; `k_scale` / `v_scale` [S_max, Hkv] fp32, an FP8 cache:
k_cache / v_cache hold e4m3 codes as uint8 (kv_fp8.py), dequantized inside the kernels.
"""

from __future__ import annotations

import torch

from freetoken.kernels.attention_decode import attention_decode
from freetoken.kernels.attention_prefill import attention_prefill
from freetoken.kernels.checks import FLOAT_DTYPES, check_same_device, check_tensor, dot_in_fp32
from freetoken.kernels.kv_fp8 import dequantize_kv

MAX_HEAD_DIM = 256


def attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start_pos: int, sm_scale: float,
    sinks: torch.Tensor | None = None, window: int | None = None, k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, H, Dh], k_cache / v_cache [S_max, Hkv, Dh] (uint8 e4m3 codes with k_scale / v_scale) -> [T, H, Dh]
    in q's dtype, softmax in fp32."""
    # 1. check
    fp8 = k_scale is not None or v_scale is not None
    check_tensor(q, "q", 3)
    check_tensor(k_cache, "k_cache", 3, dtypes=(torch.uint8,) if fp8 else FLOAT_DTYPES)
    check_tensor(v_cache, "v_cache", 3, dtypes=(torch.uint8,) if fp8 else FLOAT_DTYPES)
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, k_scale=k_scale, v_scale=v_scale)
    T, H, Dh = q.shape
    S_max, Hkv, Dh_k = k_cache.shape
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} != k_cache {tuple(k_cache.shape)}")
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"v_cache: dtype {v_cache.dtype} != k_cache {k_cache.dtype}")
    if Dh_k != Dh:
        raise ValueError(f"k_cache: head dim {Dh_k} != q's {Dh}")
    if Dh > MAX_HEAD_DIM:
        raise ValueError(f"q: head dim {Dh} > {MAX_HEAD_DIM}")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"q: {H} heads is not a multiple of k_cache's {Hkv} kv heads")
    if start_pos < 0 or start_pos + T > S_max:
        raise ValueError(f"start_pos: {start_pos} + {T} queries exceeds the cache's {S_max} positions")
    if sinks is not None:
        check_tensor(sinks, "sinks", 1, dtypes=(torch.float32,))
        check_same_device(q=q, sinks=sinks)
        if sinks.shape[0] != H:
            raise ValueError(f"sinks: {sinks.shape[0]} logits, expected one per head ({H})")
    if window is not None and window <= 0:
        raise ValueError(f"window: {window} must be positive")
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)) if fp8 else ():
        check_tensor(scale, name, 2, dtypes=(torch.float32,))
        if tuple(scale.shape) != (S_max, Hkv):
            raise ValueError(f"{name}: shape {tuple(scale.shape)}, expected one scale per (position, kv head) "
                             f"{(S_max, Hkv)}")
    # 2. allocate
    out = torch.empty((T, H, Dh), dtype=q.dtype, device=q.device)
    if T == 0:
        return out
    # 3. launch
    launch = attention_decode if T == 1 else attention_prefill
    dot_fp32 = dot_in_fp32(q) if fp8 else dot_in_fp32(q, k_cache, v_cache)  # fp8 codes are decoded to q's dtype
    return launch(q, k_cache, v_cache, int(start_pos), float(sm_scale), out, dot_fp32,
                  sinks.contiguous() if sinks is not None else None, None if window is None else int(window),
                  k_scale, v_scale)


def visible_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, L: int, k_scale: torch.Tensor | None,
               v_scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The first L positions of the cache in fp32 (an FP8 cache dequantized through torch's float8_e4m3fn)."""
    if k_scale is None:
        return k_cache[:L].float(), v_cache[:L].float()
    return dequantize_kv(k_cache[:L], k_scale[:L]), dequantize_kv(v_cache[:L], v_scale[:L])


def attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start_pos: int, sm_scale: float,
    sinks: torch.Tensor | None = None, window: int | None = None, k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Explicit fp32 scores, causal (and window) mask, softmax (with the sink column, then dropped), weighted sum;
    kv heads repeated for GQA; an FP8 cache dequantized first."""
    T, H, Dh = q.shape
    Hkv = k_cache.shape[1]
    L = start_pos + T
    k, v = visible_kv(k_cache, v_cache, L, k_scale, v_scale)  # [L, Hkv, Dh]
    k = k.repeat_interleave(H // Hkv, dim=1)  # [L, H, Dh]
    v = v.repeat_interleave(H // Hkv, dim=1)
    scores = torch.einsum("thd,shd->hts", q.float(), k) * sm_scale  # [H, T, L]
    q_pos = start_pos + torch.arange(T, device=q.device)
    k_pos = torch.arange(L, device=q.device)[None, :]
    visible = k_pos <= q_pos[:, None]  # [T, L]
    if window is not None:
        visible &= k_pos > q_pos[:, None] - window
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks.float()[:, None, None].expand(H, T, 1)], dim=-1)  # [H, T, L + 1]
    probs = torch.softmax(scores, dim=-1)[..., :L]
    return torch.einsum("hts,shd->thd", probs, v).to(q.dtype)
