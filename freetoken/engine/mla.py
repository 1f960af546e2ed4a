"""DeepSeek's multi-head latent attention (MLA), the non-absorbed form: the shared latent is decompressed into
per-head k / v every call and the KV cache stores those (head dim max(qk_head_dim, v_head_dim), the shorter one
zero-padded), so the shared attention kernels and KV cache serve it unchanged. Zero dims add nothing to q . k, and
the padded v columns are dropped from the output.

Rope layout: at load, each head's q rows and the shared k_pe rows are reordered to (rope dims, then nope dims), the
rope dims de-interleaved (2i, 2i + 1 -> i, i + R/2) where the checkpoint pairs adjacent dims. q . k is unchanged by
a permutation applied to both, and the de-interleaved pairs are exactly the neox rotate_half pairs apply_rope
rotates over its first rotary_dim dims.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from freetoken.engine.dsa import IndexerWeights, IndexRows, index_rows, load_indexer, pick, sparse_attention
from freetoken.engine.kernelset import KernelSet
from freetoken.engine.kv import KVCache
from freetoken.models.config import ModelConfig
from freetoken.models.family import ATTN


@dataclass(slots=True)
class MLAWeights:
    wq: torch.Tensor  # q_proj [H (R + N), D] or q_b_proj [H (R + N), Rq]; per head rope rows first
    wa: torch.Tensor  # [Rq + R + C, D]: q_a_proj (with q LoRA, Rq rows), then kv_a's shared k_pe rows, its latent's
    kv_a_norm: torch.Tensor  # [C]
    wkv_b: torch.Tensor  # [H (N + V), C]: per head k_nope rows, then v rows
    wo: torch.Tensor  # [D, H V]
    q_lora: int = 0  # Rq: the leading rows of wa that are q_a_proj's (one launch for both projections of h)
    q_a_norm: torch.Tensor | None = None  # [Rq]
    ba: torch.Tensor | None = None  # [Rq + R + C] (zeros for a projection without a bias)
    bo: torch.Tensor | None = None
    indexer: IndexerWeights | None = None  # DSA (GLM-5): this layer's own lightning indexer


def _rope_first(nope: int, rope: int, interleave: bool) -> torch.Tensor:
    """Row order of one (nope, rope) block -> (rope de-interleaved, nope)."""
    r = torch.arange(rope)
    r = torch.cat([r[0::2], r[1::2]]) if interleave else r
    return torch.cat([nope + r, torch.arange(nope)])


def load_mla(cfg: ModelConfig, layer: int, dev: Callable[[str], torch.Tensor],
             opt: Callable[[str], torch.Tensor | None]) -> MLAWeights:
    m, H, a = cfg.mla, cfg.num_heads, ATTN.format(l=layer)
    R, N, C = m.qk_rope_head_dim, m.qk_nope_head_dim, m.kv_lora_rank
    head = _rope_first(N, R, m.rope_interleave)
    q_rows = (torch.arange(H)[:, None] * (N + R) + head[None, :]).reshape(-1)
    kv_rows = torch.cat([C + _rope_first(0, R, m.rope_interleave), torch.arange(C)])
    wkv_a, bkv_a = dev(a + "kv_a_proj_with_mqa.weight")[kv_rows], opt(a + "kv_a_proj_with_mqa.bias")
    bkv_a = None if bkv_a is None else bkv_a[kv_rows]
    wq_a = bq_a = None
    if m.q_lora_rank:
        wq_a, bq_a = dev(a + "q_a_proj.weight"), opt(a + "q_a_proj.bias")
    wa = wkv_a if wq_a is None else torch.cat([wq_a, wkv_a])
    ba = None
    if bq_a is not None or bkv_a is not None:
        dtype = (bq_a if bq_a is not None else bkv_a).dtype
        ba = torch.cat([torch.zeros(w.shape[0], dtype=dtype, device=wa.device) if b is None else b
                        for w, b in ((wq_a, bq_a), (wkv_a, bkv_a)) if w is not None])
    w = MLAWeights(
        wq=dev(a + ("q_b_proj.weight" if m.q_lora_rank else "q_proj.weight"))[q_rows].contiguous(),
        wa=wa.contiguous(), kv_a_norm=dev(a + "kv_a_layernorm.weight"), wkv_b=dev(a + "kv_b_proj.weight"),
        wo=dev(a + "o_proj.weight"), q_lora=m.q_lora_rank or 0, ba=None if ba is None else ba.contiguous(),
        bo=opt(a + "o_proj.bias"))
    if m.q_lora_rank:
        w.q_a_norm = dev(a + "q_a_layernorm.weight")
    if cfg.dsa is not None and layer in cfg.dsa.indexer_layers:
        w.indexer = load_indexer(cfg, layer, dev)
    return w


def mla_project(ks: KernelSet, cfg: ModelConfig, w: MLAWeights, h: torch.Tensor, positions: torch.Tensor,
                rope: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """h [T, D] at positions [T] -> q, k, v [T, H, Dc] (roped, zero-padded to the cache head dim) and the q LoRA
    residual q_in (h itself without q LoRA), which DSA's indexer reads."""
    m, eps = cfg.mla, cfg.rms_norm_eps
    T, H, Dc = h.shape[0], cfg.num_heads, cfg.head_dim
    R, N, V = m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim
    projected = ks.linear(h, w.wa, w.ba)  # [T, Rq + R + C]: q_a (with q LoRA) and kv_a in one launch
    q_in = h if not w.q_lora else ks.rms_norm(projected[:, :w.q_lora], w.q_a_norm, eps)
    q = ks.linear(q_in, w.wq).view(T, H, R + N)
    q = ks.apply_rope(q.contiguous(), positions, cfg.rope_theta, R, **rope)
    compressed = projected[:, w.q_lora:]  # [T, R + C]
    k_pe = ks.apply_rope(compressed[:, :R].contiguous().view(T, 1, R), positions, cfg.rope_theta, **rope)
    latent = ks.rms_norm(compressed[:, R:].contiguous(), w.kv_a_norm, eps)  # [T, C]
    kv_b = ks.linear(latent, w.wkv_b).view(T, H, N + V)
    k = torch.cat([k_pe.expand(T, H, R), kv_b[..., :N]], dim=-1)  # [T, H, R + N]
    pad = Dc - (R + N)
    q, k = torch.nn.functional.pad(q, (0, pad)), torch.nn.functional.pad(k, (0, pad))
    v = torch.nn.functional.pad(kv_b[..., N:], (0, Dc - V))  # [T, H, Dc]
    return q.contiguous(), k, v, q_in


def _attend(ks: KernelSet, cfg: ModelConfig, w: MLAWeights, layer: int, q: torch.Tensor, kv: KVCache,
            start_pos: int, positions: torch.Tensor, sm_scale: float, rows: IndexRows | None) -> torch.Tensor:
    """One sequence's queries q [T, H, Dc] over its cache (k / v already written) -> [T, H, Dc]; with DSA over the
    picks of this layer's indexer (its rows picked here) or of the last indexer layer."""
    if cfg.dsa is None:
        return ks.attention(q, kv.k[layer], kv.v[layer], start_pos, sm_scale, **kv.scales(layer))
    if rows is not None:
        kv.picks = pick(cfg, rows, layer, kv, start_pos, positions)
    return sparse_attention(ks, q, kv, layer, start_pos, kv.picks, sm_scale)


def _index_rows(ks: KernelSet, cfg: ModelConfig, w: MLAWeights, h: torch.Tensor, q_in: torch.Tensor,
                positions: torch.Tensor, rope: dict) -> IndexRows | None:
    """DSA: the indexer's rows where this layer has its own indexer, else None."""
    return None if w.indexer is None else index_rows(ks, cfg, w.indexer, h, q_in, positions, rope)


def _out(ks: KernelSet, cfg: ModelConfig, w: MLAWeights, o: torch.Tensor) -> torch.Tensor:
    """o [T, H, Dc] -> o_proj over the v dims [T, D]."""
    T, V = o.shape[0], cfg.mla.v_head_dim
    return ks.linear(o[..., :V].reshape(T, cfg.num_heads * V).contiguous(), w.wo, w.bo)


def mla_attention(ks: KernelSet, cfg: ModelConfig, w: MLAWeights, layer: int, h: torch.Tensor, kv: KVCache,
                  start_pos: int, positions: torch.Tensor, sm_scale: float, rope: dict) -> torch.Tensor:
    """h [T, D] -> the attention output [T, D]; writes this call's per-head k / v into kv at start_pos."""
    q, k, v, q_in = mla_project(ks, cfg, w, h, positions, rope)
    kv.write(layer, start_pos, k, v)
    rows = _index_rows(ks, cfg, w, h, q_in, positions, rope)
    return _out(ks, cfg, w, _attend(ks, cfg, w, layer, q, kv, start_pos, positions, sm_scale, rows))


def mla_attention_batch(ks: KernelSet, cfg: ModelConfig, w: MLAWeights, layer: int, h: torch.Tensor,
                        kvs: list[KVCache], starts: list[int], positions: torch.Tensor, sm_scale: float,
                        rope: dict) -> torch.Tensor:
    """A decode batch: h [B, D], row b the next token of the sequence in kvs[b] at position starts[b] -> [B, D].
    The projections run once over the B rows; each sequence's k / v go to its own cache and its query attends
    there (the host kernels: one call for the batch, without DSA)."""
    q, k, v, q_in = mla_project(ks, cfg, w, h, positions, rope)
    for b, (kv, start) in enumerate(zip(kvs, starts)):
        kv.write(layer, start, k[b:b + 1], v[b:b + 1])
    if ks.name == "host" and cfg.dsa is None:
        from freetoken.host.ops import attention_decode_batch

        scales = [kv.scales(layer) for kv in kvs]
        fp8 = {"k_scales": [s["k_scale"] for s in scales], "v_scales": [s["v_scale"] for s in scales]} \
            if scales[0] else {}
        o = attention_decode_batch(q, [kv.k[layer] for kv in kvs], [kv.v[layer] for kv in kvs], starts, sm_scale,
                                   **fp8)
    else:
        rows = _index_rows(ks, cfg, w, h, q_in, positions, rope)
        o = torch.cat([_attend(ks, cfg, w, layer, q[b:b + 1], kv, start, positions[b:b + 1], sm_scale,
                               None if rows is None else rows.rows(b, b + 1))
                       for b, (kv, start) in enumerate(zip(kvs, starts))])
    return _out(ks, cfg, w, o)
