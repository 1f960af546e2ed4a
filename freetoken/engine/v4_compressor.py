"""DeepSeek-V4's KV compression and lightning indexer over one sequence's cache (engine/v4_kv.py).

A compressor projects every token to kv and gate rows (csa: two series of C channels, hca: one); each complete
window of m tokens becomes an entry: per channel the softmax over its slots of (gate + position bias) weighting the
kv values (kernels/compress_pool.py), RMS-normed, roped at position e m (the compressed layers' rope). An hca slot set
is the window's m rows; a csa entry's 2m slots are the previous window's first series, then this window's second
(the very first entry's previous half is empty). The window rows live in a ring addressed by window parity, so
rerunning a position writes what it wrote before (a failed decode step can be stepped again).

The indexer (csa layers) compresses its own keys the same way (Di channels) and picks per query the index_topk
entries of highest sum_h w_h relu(q_h . k) Di^-0.5 among those whose window closed at or before the query
(transformers' DeepseekV4Indexer); hca layers see every closed entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from freetoken.engine.dsa import top_indices
from freetoken.engine.kernelset import KernelSet


def rope_first(width: int, rope: int, pairs: int = 1) -> torch.Tensor:
    """Row order that moves a head vector's trailing `rope` dims (interleaved pairs 2i, 2i + 1) first, de-interleaved
    (i, i + rope / 2): apply_rope's rotate_half pairs; q . k, the pooling and the norms are unchanged by it. pairs:
    that many head vectors side by side."""
    r = torch.arange(rope)
    one = torch.cat([width - rope + torch.cat([r[0::2], r[1::2]]), torch.arange(width - rope)])
    return torch.cat([p * width + one for p in range(pairs)])


@dataclass(slots=True)
class CompressorWeights:
    ape: torch.Tensor  # [m, pairs C] fp32 position bias, channels rope first
    norm: torch.Tensor  # [C] fp32
    rate: int  # m
    pairs: int  # 2: overlapping windows (csa), 1 (hca)


def load_compressor(get: Callable[[str], torch.Tensor], prefix: str, rate: int, width: int, pairs: int,
                    rope: int) -> tuple[CompressorWeights, torch.Tensor]:
    """(the compressor, its wkv then wgate rows [2 pairs C, D] for the layer's one projection of h)."""
    order = rope_first(width, rope, pairs)
    rows = torch.cat([get(prefix + "wkv.weight")[order], get(prefix + "wgate.weight")[order]])
    w = CompressorWeights(get(prefix + "ape")[:, order].float().contiguous(),
                          get(prefix + "norm.weight")[rope_first(width, rope)].float().contiguous(), rate, pairs)
    return w, rows


def compress(ks: KernelSet, w: CompressorWeights, kv_rows: torch.Tensor, gate_rows: torch.Tensor,
             win_kv: torch.Tensor, win_gate: torch.Tensor, start: int, entries: torch.Tensor, eps: float,
             theta: float, rope: int, rope_opts: dict) -> None:
    """One sequence's new rows kv_rows / gate_rows [T, pairs C] at positions [start, start + T): the entries of the
    windows they close go to entries[e], the rows later windows need to the ring win_kv / win_gate [S, m, pairs C]."""
    m, S, T = w.rate, win_kv.shape[0], kv_rows.shape[0]
    C = kv_rows.shape[1] // w.pairs
    fill, first = start % m, start // m  # rows already in window `first`, and its index
    rows_kv = torch.cat([win_kv[first % S, :fill], kv_rows])  # [fill + T, pairs C]
    rows_gate = torch.cat([win_gate[first % S, :fill], gate_rows])
    n = (fill + T) // m  # windows first .. first + n - 1 close
    if n:
        slots_kv = rows_kv[:n * m].view(n, m, -1)
        slots_gate = rows_gate[:n * m].view(n, m, -1).float() + w.ape  # [n, m, pairs C]
        if w.pairs == 2:  # the previous window's first series, then this window's second
            if first:
                prev_kv = win_kv[(first - 1) % S, :, :C][None]
                prev_gate = win_gate[(first - 1) % S, :, :C][None].float() + w.ape[:, :C]
            else:  # the sequence's first window: an empty half (weight 0)
                prev_kv = torch.zeros_like(slots_kv[:1, :, :C])
                prev_gate = torch.full_like(slots_gate[:1, :, :C], float("-inf"))
            slots_kv = torch.cat([torch.cat([prev_kv, slots_kv[:-1, :, :C]]), slots_kv[:, :, C:]], dim=1)
            slots_gate = torch.cat([torch.cat([prev_gate, slots_gate[:-1, :, :C]]), slots_gate[:, :, C:]], dim=1)
        pooled = ks.rms_norm(ks.compress_pool(slots_kv.contiguous(), slots_gate.contiguous()), w.norm, eps)  # [n, C]
        positions = (first + torch.arange(n, device=pooled.device)) * m
        entries[first:first + n] = ks.apply_rope(pooled.view(n, 1, C), positions, theta, rope, **rope_opts).view(n, C)
    for window in range(max(first, first + n - S + 1), first + n + 1):  # csa: the last closed one and the open one
        lo, hi = (window - first) * m, min((window - first + 1) * m, fill + T)
        if lo < hi:
            win_kv[window % S, :hi - lo] = rows_kv[lo:hi]
            win_gate[window % S, :hi - lo] = rows_gate[lo:hi]


def closed(positions: torch.Tensor, m: int) -> torch.Tensor:
    """[T] the entries each query may see: those whose window closed at or before it."""
    return (positions + 1) // m


def all_picks(positions: torch.Tensor, total: int, m: int) -> torch.Tensor:
    """hca: every closed entry, per query [T, total] (-1 past the query's own)."""
    ids = torch.arange(total, device=positions.device)[None, :].expand(positions.shape[0], total)
    return torch.where(ids < closed(positions, m)[:, None], ids, -1)


def index_picks(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor, m: int,
                topk: int) -> torch.Tensor:
    """csa: q [T, Hi, Di] (roped), weights [T, Hi] fp32 (weights_proj x Hi^-0.5), keys [C, Di] the indexer's
    entries -> [T, min(topk, C)] picked entries per query, -1 where a query has fewer closed entries."""
    T, C = q.shape[0], keys.shape[0]
    if C == 0:
        return torch.empty((T, 0), dtype=torch.long, device=q.device)
    scores = torch.relu(torch.einsum("thd,sd->ths", q.float(), keys.float())) * q.shape[-1] ** -0.5  # [T, Hi, C]
    index = (scores * weights[..., None]).sum(1)  # [T, C]
    limit = closed(positions, m)[:, None]
    index = index.masked_fill(torch.arange(C, device=q.device)[None, :] >= limit, float("-inf"))
    picks = top_indices(index, min(topk, C))  # equal scores (relu zeroes every head) in entry order, at any chunk
    return torch.where(picks >= limit, -1, picks)
