"""DeepSeek-V4's attention block (transformers' DeepseekV4Attention) over the V4KV of each sequence.

h -> one projection of every row (q_a, the shared key = value row, a compressor's kv / gate rows, the indexer's and
its head weights) -> q = rope(unit RMSNorm per head of wq_b(RMSNorm(q_a)))), k = rope(RMSNorm(wkv h)); each sequence
writes its k rows, compresses the windows they close and picks its entries; attention over the window and the picks
with a sink per head (kernels/attention_compressed.py); the output's rope dims turned back by the query's angle
(rope at -position: K = V carried the keys' rotation into the values); wo_a per group of heads, then wo_b.

Head vectors are laid out rope-first at load (compressor.rope_first): q . k, the pooling, the norms and the
output projection (its columns permuted alike) are unchanged, and the rope dims are apply_rope's rotate_half pairs.
A decode batch runs the projections once over its rows and the per-sequence part row by row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from freetoken.engine.kernelset import KernelSet
from freetoken.engine.v4_compressor import (CompressorWeights, all_picks, compress, index_picks, load_compressor,
                                            rope_first)
from freetoken.engine.v4_kv import V4KV
from freetoken.kernels.rope import yarn_inv_freq
from freetoken.models.config import ModelConfig

ATTN = "model.layers.{l}.attn."


@dataclass(slots=True)
class V4AttentionWeights:
    w_in: torch.Tensor  # [sum(splits), D]: every projection of h, in split order
    splits: tuple[int, ...]  # q_a Rq, kv Dh, compressor kv + gate (0 / 2 pairs Dh), indexer kv + gate (0 / 4 Di), Hi
    q_norm: torch.Tensor  # [Rq] fp32
    wq_b: torch.Tensor  # [H Dh, Rq], each head rope first
    kv_norm: torch.Tensor  # [Dh] fp32
    ones: torch.Tensor  # [Dh]: the per-head q norm has no weight
    sinks: torch.Tensor  # [H] fp32
    wo_a: list[torch.Tensor]  # per group [Ro, H Dh / G], columns rope first per head
    wo_b: torch.Tensor  # [D, G Ro]
    theta: float
    rope: dict  # apply_rope's YaRN options on compressed layers
    compressor: CompressorWeights | None = None
    indexer: CompressorWeights | None = None
    index_wq: torch.Tensor | None = None  # [Hi Di, Rq], each head rope first


def layer_rope(cfg: ModelConfig, layer: int, device: torch.device) -> tuple[float, dict]:
    """(theta, apply_rope options): rope_theta on sliding layers, compress_rope_theta (YaRN where configured) on
    compressed ones, as transformers' "main" / "compress" rotary embeddings."""
    v = cfg.v4
    if v.kinds[layer] == "sliding":
        return cfg.rope_theta, {}
    if v.compress_yarn is None:
        return v.compress_rope_theta, {}
    y = v.compress_yarn
    inv_freq, scale = yarn_inv_freq(v.compress_rope_theta, v.rope_dim, y.factor, y.original_max_position_embeddings,
                                    y.beta_fast, y.beta_slow, y.truncate, y.attention_factor)
    return v.compress_rope_theta, {"inv_freq": inv_freq.to(device), "scale": scale}


def load_v4_attention(cfg: ModelConfig, layer: int, get: Callable[[str], torch.Tensor],
                      device: torch.device) -> V4AttentionWeights:
    v, a, D, H, Dh = cfg.v4, ATTN.format(l=layer), cfg.hidden_size, cfg.num_heads, cfg.head_dim
    R, Di, G = v.rope_dim, v.index_head_dim, v.o_groups
    head = rope_first(Dh, R)
    rows = [get(a + "wq_a.weight"), get(a + "wkv.weight")[head]]
    compressor = indexer = index_wq = None
    if v.kinds[layer] != "sliding":
        pairs = 2 if v.kinds[layer] == "csa" else 1
        compressor, both = load_compressor(get, a + "compressor.", v.rate(layer), Dh, pairs, R)
        rows.append(both)
    if v.kinds[layer] == "csa":
        indexer, both = load_compressor(get, a + "indexer.compressor.", v.csa_rate, Di, 2, R)
        rows += [both, get(a + "indexer.weights_proj.weight")]
        index_wq = get(a + "indexer.wq_b.weight")[rope_first(Di, R, v.index_heads)].contiguous()
    wo_a = get(a + "wo_a.weight")  # [G Ro, H Dh / G]
    per_group = wo_a.view(G, v.o_lora_rank, -1)[:, :, rope_first(Dh, R, H // G)]
    theta, rope = layer_rope(cfg, layer, device)
    return V4AttentionWeights(
        w_in=torch.cat(rows).contiguous(), splits=tuple(r.shape[0] for r in rows) + (0,) * (5 - len(rows)),
        q_norm=get(a + "q_norm.weight").float(), wq_b=get(a + "wq_b.weight")[rope_first(Dh, R, H)].contiguous(),
        kv_norm=get(a + "norm.weight")[head].float().contiguous(), ones=torch.ones(Dh, device=device),
        sinks=get(a + "attn_sink").float().contiguous(), wo_a=[g.contiguous() for g in per_group],
        wo_b=get(a + "wo_b.weight"), theta=theta, rope=rope, compressor=compressor, indexer=indexer,
        index_wq=index_wq)


def v4_attention(ks: KernelSet, cfg: ModelConfig, w: V4AttentionWeights, layer: int, h: torch.Tensor,
                 kvs: list[V4KV], starts: list[int], counts: list[int], positions: torch.Tensor) -> torch.Tensor:
    """h [N, D]: counts[i] rows of the sequence in kvs[i] from position starts[i] (one sequence's T tokens, or one
    token of each of a decode batch), positions [N] -> [N, D]."""
    # N = rows, H = heads, Dh = head dim, R = rope dims, Hi / Di = indexer heads / head dim
    v, eps, N, H, Dh, R = cfg.v4, cfg.rms_norm_eps, h.shape[0], cfg.num_heads, cfg.head_dim, cfg.v4.rope_dim
    q_a, kv_row, comp, idx, idx_w = ks.linear(h, w.w_in).split(w.splits, dim=1)
    q_resid = ks.rms_norm(q_a.contiguous(), w.q_norm, eps)  # [N, Rq]
    q = ks.rms_norm(ks.linear(q_resid, w.wq_b).view(N * H, Dh), w.ones, eps).view(N, H, Dh)
    q = ks.apply_rope(q, positions, w.theta, R, **w.rope)
    k = ks.apply_rope(ks.rms_norm(kv_row.contiguous(), w.kv_norm, eps).view(N, 1, Dh), positions, w.theta, R, **w.rope)
    if w.indexer is not None:
        iq = ks.linear(q_resid, w.index_wq).view(N, v.index_heads, v.index_head_dim)
        iq = ks.apply_rope(iq, positions, w.theta, R, **w.rope)  # [N, Hi, Di]
        idx_w = idx_w.float() * v.index_heads ** -0.5  # [N, Hi]
    outs, lo = [], 0
    for kv, start, n in zip(kvs, starts, counts):
        rows = slice(lo, lo + n)
        kv.write(layer, start, k[rows])
        entries, picks = kv.k[layer][:0, 0], torch.empty((n, 0), dtype=torch.long, device=h.device)
        if w.compressor is not None:
            total = (start + n) // w.compressor.rate
            half = comp.shape[1] // 2
            compress(ks, w.compressor, comp[rows, :half], comp[rows, half:], kv.win_kv[layer], kv.win_gate[layer],
                     start, kv.entries[layer], eps, w.theta, R, w.rope)
            entries = kv.entries[layer][:total]
            if w.indexer is None:
                picks = all_picks(positions[rows], total, w.compressor.rate)
            else:
                half = idx.shape[1] // 2
                compress(ks, w.indexer, idx[rows, :half], idx[rows, half:], kv.iwin_kv[layer], kv.iwin_gate[layer],
                         start, kv.index_entries[layer], eps, w.theta, R, w.rope)
                picks = index_picks(iq[rows], idx_w[rows], kv.index_entries[layer][:total], positions[rows],
                                    w.indexer.rate, v.index_topk)
        outs.append(ks.attention_compressed(q[rows].contiguous(), kv.k[layer][:, 0], entries, picks, start, v.window,
                                            w.sinks, Dh ** -0.5))
        lo += n
    o = ks.apply_rope(torch.cat(outs), -positions, w.theta, R, **w.rope)  # [N, H, Dh]: the rope turned back
    grouped = o.view(N, v.o_groups, -1)  # [N, G, H Dh / G]
    mixed = torch.cat([ks.linear(grouped[:, g].contiguous(), wo) for g, wo in enumerate(w.wo_a)], dim=1)
    return ks.linear(mixed, w.wo_b)
