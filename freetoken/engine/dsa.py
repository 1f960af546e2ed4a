"""DeepSeek sparse attention (GLM-5, models/glm_moe_dsa.py) over the MLA cache: a lightning indexer scores every
earlier key per query, and the query attends only to its index_topk best.

Indexer (HF's GlmMoeDsaIndexer): q_i = wq_b(q LoRA residual) [T, Hi, Di], k_i = LayerNorm(wk(h)) [T, Di], both with
rope on their first R dims (interleaved pairs, de-interleaved at load as mla.py does, the LayerNorm's weight and bias
permuted with them: a LayerNorm commutes with a permutation), index[t, s] = sum_h w[t, h] relu(q_i[t, h] . k_i[s])
Di^-0.5 with w = weights_proj(h) Hi^-0.5. The k_i of every position live in the cache beside the KV (DSAKVCache).
While a sequence holds at most index_topk keys every query sees all of them, so the dense causal attention runs
(the same math); past that each query's picks are gathered and attended by the shared attention kernel, one query
at a time. Layers without their own indexer reuse the last indexer layer's picks of the same forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from freetoken.engine.kernelset import KernelSet
from freetoken.engine.kv import KVCache
from freetoken.models.config import ModelConfig
from freetoken.models.family import ATTN

LAYER_NORM_EPS = 1e-6  # HF's indexer k_norm


@dataclass(slots=True)
class IndexerWeights:
    wq: torch.Tensor  # [Hi Di, Rq]: per head the rope dims de-interleaved, then the rest
    wk: torch.Tensor  # [Di, D], rows in the same order
    k_norm: torch.Tensor  # [Di] LayerNorm weight
    k_norm_bias: torch.Tensor  # [Di]
    w_heads: torch.Tensor  # [Hi, D] weights_proj


class DSAKVCache(KVCache):
    """The MLA KV cache plus each indexer layer's keys index_k[l] [max_tokens, Di] and the picks of the last
    indexer layer run in the current forward ([T, topk] key positions, None while attention is dense)."""

    def __init__(self, cfg: ModelConfig, max_tokens: int, dtype: torch.dtype, device: torch.device | str,
                 kv_dtype: str = "auto"):
        """kv_dtype: of the per-head K/V (the indexer keys stay in the model's dtype)."""
        super().__init__(cfg.num_layers, max_tokens, cfg.num_kv_heads, cfg.head_dim, dtype, device, kv_dtype=kv_dtype)
        self.index_k = {l: torch.zeros((max_tokens, cfg.dsa.index_head_dim), dtype=dtype, device=device)
                        for l in cfg.dsa.indexer_layers}
        self.picks: torch.Tensor | None = None


def load_indexer(cfg: ModelConfig, layer: int, dev: Callable[[str], torch.Tensor]) -> IndexerWeights:
    d, R, i = cfg.dsa, cfg.mla.qk_rope_head_dim, ATTN.format(l=layer) + "indexer."
    r = torch.arange(R)
    order = torch.cat([r[0::2], r[1::2], torch.arange(R, d.index_head_dim)])  # [Di]
    q_rows = (torch.arange(d.index_heads)[:, None] * d.index_head_dim + order[None, :]).reshape(-1)
    return IndexerWeights(wq=dev(i + "wq_b.weight")[q_rows].contiguous(), wk=dev(i + "wk.weight")[order].contiguous(),
                          k_norm=dev(i + "k_norm.weight")[order].contiguous(),
                          k_norm_bias=dev(i + "k_norm.bias")[order].contiguous(),
                          w_heads=dev(i + "weights_proj.weight"))


@dataclass(slots=True)
class IndexRows:
    """The indexer's projections of T rows: keys k [T, Di] and queries q [T, Hi, Di] (LayerNormed / roped), head
    weights [T, Hi] fp32 (weights_proj x Hi^-0.5)."""

    k: torch.Tensor
    q: torch.Tensor
    weights: torch.Tensor

    def rows(self, lo: int, hi: int) -> IndexRows:
        return IndexRows(self.k[lo:hi], self.q[lo:hi], self.weights[lo:hi])


def index_rows(ks: KernelSet, cfg: ModelConfig, w: IndexerWeights, h: torch.Tensor, q_resid: torch.Tensor,
               positions: torch.Tensor, rope: dict) -> IndexRows:
    """h [T, D] and the q LoRA residual [T, Rq] at positions [T] -> the indexer's keys, queries and head weights
    (a decode batch computes them once for all its rows)."""
    d, R, T = cfg.dsa, cfg.mla.qk_rope_head_dim, h.shape[0]
    k = ks.linear(h, w.wk)  # [T, Di]
    k = ks.rms_norm((k - k.mean(-1, keepdim=True)).contiguous(), w.k_norm, LAYER_NORM_EPS) + w.k_norm_bias  # LayerNorm
    k = ks.apply_rope(k.view(T, 1, -1).contiguous(), positions, cfg.rope_theta, R, **rope).view(T, -1)
    q = ks.linear(q_resid, w.wq).view(T, d.index_heads, d.index_head_dim)
    q = ks.apply_rope(q.contiguous(), positions, cfg.rope_theta, R, **rope)  # [T, Hi, Di]
    weights = ks.linear(h, w.w_heads).float() * d.index_heads ** -0.5  # [T, Hi]
    return IndexRows(k, q, weights)


def pick(cfg: ModelConfig, rows: IndexRows, layer: int, kv: DSAKVCache, start_pos: int,
         positions: torch.Tensor) -> torch.Tensor | None:
    """Write one sequence's indexer keys at start_pos; [T, topk] picked key positions per query (entries past a
    query's own position are padding), or None when every query sees at most index_topk keys."""
    d, T = cfg.dsa, rows.k.shape[0]
    kv.index_k[layer][start_pos:start_pos + T] = rows.k
    S = start_pos + T
    if S <= d.index_topk:
        return None
    keys = kv.index_k[layer][:S].float()  # [S, Di]
    scores = torch.relu(torch.einsum("thd,sd->ths", rows.q.float(), keys)) * d.index_head_dim ** -0.5  # [T, Hi, S]
    index = torch.einsum("th,ths->ts", rows.weights, scores)  # [T, S]
    future = torch.arange(S, device=keys.device)[None, :] > positions[:, None]
    return top_indices(index.masked_fill(future, float("-inf")), d.index_topk)  # [T, topk]


def top_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """[T, S] -> [T, k] the positions of the k highest scores per row, equal scores in position order. torch.topk
    leaves the order of equal scores unspecified (it changes with the tensor's shape), and an indexer's relu zeroes
    every head's score of many keys: with topk the picks among those zeros, so the logits, moved with the prefill
    chunk. A stable sort picks the earliest keys at any chunk."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]


def index_picks(ks: KernelSet, cfg: ModelConfig, w: IndexerWeights, layer: int, h: torch.Tensor, q_resid: torch.Tensor,
                kv: DSAKVCache, start_pos: int, positions: torch.Tensor, rope: dict) -> torch.Tensor | None:
    """index_rows, then pick: one sequence's T tokens at start_pos."""
    return pick(cfg, index_rows(ks, cfg, w, h, q_resid, positions, rope), layer, kv, start_pos, positions)


def sparse_attention(ks: KernelSet, q: torch.Tensor, kv: KVCache, layer: int, start_pos: int,
                     picks: torch.Tensor | None, sm_scale: float) -> torch.Tensor:
    """q [T, H, Dc] -> [T, H, Dc]: each query over its picked keys (picks None: every earlier key)."""
    if picks is None:
        return ks.attention(q, kv.k[layer], kv.v[layer], start_pos, sm_scale, **kv.scales(layer))
    out = []
    for t in range(q.shape[0]):
        sel = picks[t][picks[t] <= start_pos + t]  # [n] the query's visible picks
        k, v = kv.k[layer][sel].contiguous(), kv.v[layer][sel].contiguous()  # [n, H, Dc]
        scales = {name: s[sel].contiguous() for name, s in kv.scales(layer).items()}  # fp8: [n, H] each
        out.append(ks.attention(q[t:t + 1].contiguous(), k, v, sel.numel() - 1, sm_scale, **scales))  # sees all n
    return torch.cat(out)
