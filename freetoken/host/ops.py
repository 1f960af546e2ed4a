"""The `host` kernel set's calls (freetoken.engine.kernelset): the C kernels (freetoken.host.kernels) where they are
built, torch where not; the same contracts as the Triton kernels, so the engine cannot tell them apart.

- linear: a few rows (decode) through the C GEMV at memory speed; many rows (prefill) through torch's GEMM in the
  weights' own dtype (oneDNN), never an fp32 copy of the weights;
- expert_ffn / expert_ffn_quant over slot tensors (dense MLPs, shared experts, a slot pool): the C MoE kernel;
- attention: decode through the C kernel, prefill through torch's SDPA on 4D tensors (kernels/host.py);
- rms_norm, apply_rope, router_topk (softmax routing): one C call each where torch would run a dozen small ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.host import grouped
from freetoken.host import kernels as hk
from freetoken.host.native import packed_matrix
from freetoken.kernels.expert_ffn_quant import check_packed_experts
from freetoken.kernels.host import attention_host, causal_after, expert_ffn_host, expert_ffn_quant_host
from freetoken.kernels.pair_sums import deferrable
from freetoken.kernels.rmsnorm import rms_norm_ref
from freetoken.kernels.rope import _inv_freq, apply_rope_ref
from freetoken.kernels.router import _check_options, router_topk_ref
from freetoken.quant.packed import PackedWeight

NATIVE_ROWS = 16  # up to this many rows a projection is weight-bandwidth bound: the C GEMV; beyond, torch's GEMM
_DENSE = (torch.float32, torch.bfloat16, torch.float16)
_MOE: dict[tuple, hk.MoEMatrices] = {}


_FREQS: dict[tuple, torch.Tensor] = {}
_VALID_ROUTING: set[tuple] = set()  # router_topk's (experts, k, score, n_group, topk_group, group_score) checked


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, round_normed: bool = True) -> torch.Tensor:
    if x.dim() != 2 or not hk.available() or x.dtype not in _DENSE or weight.dtype not in _DENSE:
        return rms_norm_ref(x, weight, eps, round_normed)
    return hk.rms_norm(x, weight, eps, round_normed)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float, rotary_dim: int | None = None,
               inv_freq: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
    Dh = x.shape[-1]
    rotary_dim = Dh if rotary_dim is None else rotary_dim
    if x.dim() != 3 or not hk.available() or x.dtype not in _DENSE or rotary_dim % 2 or rotary_dim > 1024:
        return apply_rope_ref(x, positions, theta, rotary_dim, inv_freq, scale)
    if inv_freq is None:
        key = (float(theta), rotary_dim)
        inv_freq = _FREQS.get(key)
        if inv_freq is None:
            inv_freq = _FREQS[key] = _inv_freq(float(theta), rotary_dim, x.device).float().contiguous()
    elif inv_freq.dtype != torch.float32 or not inv_freq.is_contiguous():
        inv_freq = inv_freq.float().contiguous()
    return hk.rope(x, positions, inv_freq, rotary_dim, scale)


def router_topk(logits: torch.Tensor, k: int, renormalize: bool, score: str = "softmax",
                bias: torch.Tensor | None = None, n_group: int = 1, topk_group: int = 1, group_score: str = "max",
                scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    if score != "softmax" or bias is not None or n_group > 1 or not hk.available() or logits.shape[1] > 4096 or \
            logits.dtype not in _DENSE:
        return router_topk_ref(logits, k, renormalize, score, bias, n_group, topk_group, group_score, scale)
    options = (logits.shape[1], k, score, n_group, topk_group, group_score)
    if options not in _VALID_ROUTING:  # checked once per model: every decode layer asks the same
        _check_options(*options)
        _VALID_ROUTING.add(options)
    return hk.softmax_topk(logits, k, renormalize, scale)


def linear(x: torch.Tensor, w, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, D_in], w [D_out, D_in] (or a quantized projection kept packed), bias [D_out] -> [T, D_out] in x's
    dtype, accumulated in fp32."""
    T = x.shape[0]
    if isinstance(w, PackedWeight):  # read as stored, however many rows
        if hk.available() and x.dtype in _DENSE:
            return hk.linear(x, w, bias)
        return linear(x, w.to_float(0).to(x.dtype), bias)
    if 0 < T <= NATIVE_ROWS and w.dtype in _DENSE and x.dtype in _DENSE and w.is_contiguous() and hk.available():
        return hk.linear(x, w, bias)
    if x.dtype != w.dtype or (w.dtype != torch.float32 and not grouped.half_gemm_fast()):
        # keep x's precision, or torch's bf16 / fp16 GEMM is a slow fallback on this CPU: compute in fp32
        return _linear_fp32(x, w, bias)
    return F.linear(x, w, None if bias is None else bias.to(w.dtype))


FP32_BLOCK_ROWS = 1024  # weight rows converted to fp32 at a time, each block multiplied while it is in cache


def _linear_fp32(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear in fp32, rounded to x's dtype. A narrower weight is converted FP32_BLOCK_ROWS rows at a time, not
    whole (written out and read back from memory): the same values, 44 -> 16 ms at 64 rows and 69 -> 41 ms at 256
    for a 12,288 x 1,024 bf16 weight on 2 Zen 3 cores (370 -> 312 ms at 2,048)."""
    xf = x.float()
    if w.dtype == torch.float32:
        return F.linear(xf, w, None if bias is None else bias.float()).to(x.dtype)
    out = torch.empty((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
    for r in range(0, w.shape[0], FP32_BLOCK_ROWS):
        rows = slice(r, r + FP32_BLOCK_ROWS)
        out[:, rows] = F.linear(xf, w[rows].float(), None if bias is None else bias[rows].float())
    return out


def _cached(key: tuple, make) -> hk.MoEMatrices:
    m = _MOE.get(key)
    if m is None:
        if len(_MOE) > 1024:
            _MOE.clear()
        m = _MOE[key] = make()
    return m


def _biases(b_gate_up: torch.Tensor | None, b_down: torch.Tensor | None) -> dict:
    if b_gate_up is None:
        return {}
    return {"b_gate_up": b_gate_up.float().contiguous(), "b_down": b_down.float().contiguous()}


@deferrable
def expert_ffn(x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor,
               w_down: torch.Tensor, b_gate_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None,
               glu: str = "silu", alpha: float = 1.702, limit: float = 7.0,
               max_experts: int | None = None) -> torch.Tensor:
    """expert_ffn's contract over slots [S, 2I, D] / [S, D, I] (slot -1: skipped) -> [T, D] in x's dtype."""
    if not (hk.available() and w_gate_up.dtype in _DENSE and w_gate_up.is_contiguous() and w_down.is_contiguous()):
        return expert_ffn_host(x, slot_ids, weights, w_gate_up, w_down, b_gate_up, b_down, glu, alpha, limit)
    ids = slot_ids.numpy()
    if grouped.available() and grouped.gemm_sized(ids, None, w_gate_up.shape[0], w_gate_up.dtype):  # prefill: GEMMs
        return grouped.grouped_experts(x, ids, weights, w_gate_up, w_down, None, b_gate_up, b_down,
                                       dict(glu=glu, alpha=alpha, limit=limit)).to(x.dtype)
    key = ("dense", w_gate_up.data_ptr(), w_down.data_ptr(), tuple(w_gate_up.shape), w_gate_up.dtype,
           None if b_gate_up is None else b_gate_up.data_ptr(), glu, alpha, limit)
    m = _cached(key, lambda: hk.MoEMatrices.dense(w_gate_up, w_down, glu=glu, alpha=alpha, limit=limit,
                                                  **_biases(b_gate_up, b_down)))
    take = torch.ones(w_gate_up.shape[0], dtype=torch.uint8)
    return hk.moe(m, x, slot_ids.to(torch.int32), weights.float(), take).to(x.dtype)


@deferrable
def expert_ffn_quant(x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, gate: PackedWeight,
                     up: PackedWeight, down: PackedWeight, **options) -> torch.Tensor:
    """expert_ffn_quant's contract: the packed slots read as stored."""
    if not hk.available():
        return expert_ffn_quant_host(x, slot_ids, weights, gate, up, down, **options)
    check_packed_experts(gate, up, down, x.shape[1])
    b_gate_up, b_down = options.get("b_gate_up"), options.get("b_down")
    glu, alpha, limit = options.get("glu", "silu"), options.get("alpha", 1.702), options.get("limit", 7.0)
    key = ("packed", gate.data.data_ptr(), up.data.data_ptr(), down.data.data_ptr(), gate.num_slots,
           None if b_gate_up is None else b_gate_up.data_ptr(), glu, alpha, limit)
    m = _cached(key, lambda: hk.MoEMatrices(packed_matrix(gate), packed_matrix(up), packed_matrix(down),
                                            gate.num_slots, glu, alpha, limit, **_biases(b_gate_up, b_down),
                                            keep=(gate, up, down)))
    take = torch.ones(gate.num_slots, dtype=torch.uint8)
    return hk.moe(m, x, slot_ids.to(torch.int32), weights.float(), take).to(x.dtype)


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start_pos: int, sm_scale: float,
              sinks: torch.Tensor | None = None, window: int | None = None, k_scale: torch.Tensor | None = None,
              v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """attention's contract (q [T, H, Dh] at positions start_pos.., the cache [>= start_pos + T, Hkv, Dh])."""
    T = q.shape[0]
    if T == 1 and hk.available():
        scales = {} if k_scale is None else {"k_scales": [k_scale], "v_scales": [v_scale]}
        return hk.attention_decode(q, [k_cache], [v_cache], [start_pos + 1], sm_scale, sinks, window,
                                   **scales).view_as(q)
    if q.dtype in (torch.bfloat16, torch.float16) and k_cache.dtype == q.dtype and sinks is None and window is None:
        return _sdpa_in_dtype(q, k_cache, v_cache, start_pos, sm_scale)
    return attention_host(q, k_cache, v_cache, start_pos, sm_scale, sinks, window, k_scale, v_scale)


def _sdpa_in_dtype(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start_pos: int,
                   sm_scale: float) -> torch.Tensor:
    """Prefill attention in the activations' own dtype (torch's flash kernel accumulates in fp32), on views of the
    cache: no fp32 copies of K and V (what a prompt of thousands of tokens paid for)."""
    T, H, Dh = q.shape
    L = start_pos + T
    qh = q.transpose(0, 1)[None]  # [1, H, T, Dh]
    kh, vh = k_cache[:L].transpose(0, 1)[None], v_cache[:L].transpose(0, 1)[None]  # [1, Hkv, L, Dh]
    mask = {"is_causal": True} if start_pos == 0 else {"attn_mask": causal_after(start_pos, T)}
    o = F.scaled_dot_product_attention(qh, kh, vh, scale=sm_scale, enable_gqa=H != kh.shape[1], **mask)
    return o[0].transpose(0, 1)  # [T, H, Dh]


def attention_decode_batch(q: torch.Tensor, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                           starts: list[int], sm_scale: float, sinks: torch.Tensor | None = None,
                           window: int | None = None, k_scales: list[torch.Tensor] | None = None,
                           v_scales: list[torch.Tensor] | None = None) -> torch.Tensor:
    """A decode batch's attention in one call: q [B, H, Dh], sequence b's query at position starts[b] against its own
    cache (k_caches[b] [>= starts[b] + 1, Hkv, Dh]) -> [B, H, Dh]; torch per sequence where the C kernels are not
    built."""
    if hk.available():
        scales = {} if k_scales is None else {"k_scales": k_scales, "v_scales": v_scales}
        return hk.attention_decode(q, k_caches, v_caches, [s + 1 for s in starts], sm_scale, sinks, window, **scales)
    return torch.cat([attention_host(q[b:b + 1], k_caches[b], v_caches[b], starts[b], sm_scale, sinks, window,
                                     None if k_scales is None else k_scales[b],
                                     None if v_scales is None else v_scales[b]) for b in range(q.shape[0])])
