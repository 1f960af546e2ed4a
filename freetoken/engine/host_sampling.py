"""The sampler's choices over a long vocabulary on the CPU, with the reference's distribution and fewer full passes.

torch's CPU argmax, comparisons, random draws and scatters over 151,936 logits cost 0.2-1.2 ms each at one thread
(amax and sum ~0.02 ms), and a served sequence pays them per token: Qwen3's default sampling (temperature 0.7,
top-k 20, top-p 0.8) took ~3.8 ms per token, top-p 0.95 alone ~6.4. So, on the CPU and from 4 blocks of logits up:
- argmax by block maxima first (first_argmax: torch.argmax's answer, the first largest);
- top-k on candidates: the k-th largest block maximum bounds the k-th largest logit from below, so every token
  top-k keeps lies in a block whose maximum reaches it; the cuts and the draw run on those few candidates;
- top-p by one vectorised sort (numpy's) instead of the radix select's scatters, of the tokens that can be kept
  only (top_p_threshold: 1.6-1.7 ms -> 0.09-0.5 ms over 151,936 probabilities);
- the draw in two steps: a block by its probability mass (float64 sums, one uniform), then the exponential race
  inside it: P(i) = P(block) x p_i / mass(block) = p_i, with one block's draws instead of V.
A seed still gives the same tokens on the same device; the GPU keeps the single-pass versions (sampling.py)."""

from __future__ import annotations

import math

import numpy as np
import torch

BLOCK = 1024  # first_argmax's and the draw's block
CANDIDATE_BLOCK = 256  # top-k's block (more blocks: a tighter bound, larger k)
MIN_BLOCKS = 4


def by_blocks(x: torch.Tensor) -> bool:
    """Whether x [V] takes this module's route: on the CPU, at least MIN_BLOCKS blocks long."""
    return x.is_cpu and x.shape[-1] >= MIN_BLOCKS * BLOCK


def _block_view(x: torch.Tensor, block: int) -> tuple[torch.Tensor, int]:
    """x [V] -> (its whole blocks [V // block, block], where the tail starts)."""
    n = x.numel() - x.numel() % block
    return x[:n].view(-1, block), n


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """x [V] or [B, V] -> torch.argmax(x, -1) (the first largest; NaN counts as largest): int64 on x's device, 0-d
    or [B]."""
    if not by_blocks(x):
        return torch.argmax(x, -1)
    rows = x.view(-1, x.shape[-1])  # [B, V]
    V = rows.shape[1]
    n = V - V % BLOCK
    tops = rows[:, :n].view(rows.shape[0], -1, BLOCK).amax(2)  # [B, V // BLOCK]
    if n < V:
        tops = torch.cat([tops, rows[:, n:].amax(1, keepdim=True)], 1)
    lo = torch.argmax(tops, 1) * BLOCK  # [B] the first block holding each row's largest
    cols = (lo[:, None] + torch.arange(BLOCK)).clamp_max_(V - 1)  # [B, BLOCK]: a short last block repeats its end,
    best = torch.argmax(rows.gather(1, cols), 1) + lo  # [B]          after it, so the first largest stays first
    return best.view(x.shape[:-1])


def top_candidates(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """x [V] -> (ids [m], logits [m]) ascending by id, holding every token >= the k-th largest logit (ties
    included); None where the bound does not hold or would not narrow (too few blocks, NaN, -inf)."""
    rows, n = _block_view(x, CANDIDATE_BLOCK)
    if rows.shape[0] < 2 * k:
        return None
    tops = rows.amax(1)  # [nb]
    bound = torch.topk(tops, k).values[-1]  # k tokens reach it, so the k-th largest logit does too
    if not math.isfinite(float(bound)):
        return None
    blocks = (tops >= bound).nonzero().squeeze(1)  # [b]
    picked = rows[blocks]  # [b, CANDIDATE_BLOCK]
    keep = picked >= bound
    ids = (blocks[:, None] * CANDIDATE_BLOCK + torch.arange(CANDIDATE_BLOCK))[keep]  # [m]
    values = picked[keep]
    if n < x.numel():  # the tail (under one block) joins whole
        ids, values = torch.cat([ids, torch.arange(n, x.numel())]), torch.cat([values, x[n:]])
    return ids, values


def top_p_threshold(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs [V] -> the smallest kept probability: sampling._sorted_threshold over all of them, the same arithmetic
    (torch's cumsum) around numpy's vectorised sort and comparison (151,936 probabilities at one thread: the sort
    0.65 ms where torch's CPU sort takes 20 and the radix select 6.4; a comparison 0.05 ms against torch's 0.2-0.5).
    Only the tokens at or above (1 - top_p) / 2V are sorted: those below hold under (1 - top_p) / 2 of the mass
    together, so the kept ones (a prefix of the sorted order, reaching top_p) lie above them, and the sorted
    candidates are that prefix, summed in the same order. Where every candidate is kept (the margin lost to
    rounding), all of them are sorted instead."""
    p = probs.contiguous().numpy()  # [V]
    candidates = p[p >= np.float32((1.0 - top_p) / (2 * p.size))]  # [m]
    threshold = _sorted_cut(candidates, top_p, whole=False)
    return threshold if threshold is not None else _sorted_cut(p, top_p, whole=True)


def _sorted_cut(p: np.ndarray, top_p: float, whole: bool) -> torch.Tensor | None:
    """p [m] -> the smallest kept of its probabilities sorted descending; None where p is not whole (the head of
    the sorted vector) and its last one is kept, so the cut may fall further on."""
    s = torch.from_numpy(np.sort(p)[::-1].copy())  # [m] descending (copied: one element keeps its -1 stride)
    kept = (torch.cumsum(s, 0) - s).numpy() < np.float32(top_p)  # [m] the mass strictly before each is under top_p
    if not whole and (kept.size == 0 or kept[-1]):
        return None
    return s[kept.size - 1 - int(np.argmax(kept[::-1]))]  # the last kept: the smallest (kept[0]: 0 < top_p)


def cut_below(probs: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """probs [V] with 0 where < threshold (torch.where(probs >= threshold, probs, 0) in one vectorised pass: the
    activation threshold keeps x > t, so t is threshold's float32 predecessor)."""
    below = np.nextafter(np.float32(threshold), np.float32(-np.inf))
    return torch.nn.functional.threshold(probs, float(below), 0.0)


def block_race(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """probs [V] -> index i drawn with probability probs[i] / sum: a block by its mass, then the race inside it."""
    from freetoken.engine.sampling import race

    rows, n = _block_view(probs, BLOCK)
    mass = rows.sum(1, dtype=torch.float64)  # [nb]
    if n < probs.numel():
        mass = torch.cat([mass, probs[n:].sum(dtype=torch.float64).view(1)])
    cdf = mass.cumsum(0)  # [nb (+1)]
    u = torch.rand(1, dtype=torch.float64, generator=gen) * cdf[-1]
    b = int(torch.searchsorted(cdf, u, right=True))  # the first block whose cdf passes u: its mass is > 0
    if b == cdf.numel():  # u rounded up to the total (or NaN: NaN logits, every token masked)
        heavy = mass.nonzero()
        b = int(heavy[-1]) if len(heavy) else 0
    lo = b * BLOCK
    return race(probs[lo:lo + BLOCK], gen) + lo


def host_pick(logits: torch.Tensor, params, gen: torch.Generator) -> torch.Tensor:
    """Sampler.pick for a long CPU vector (by_blocks): the same distribution as allowed_probs + race over V."""
    from freetoken.engine.sampling import allowed_probs, race

    if params.top_k:
        found = top_candidates(logits, params.top_k)
        if found is not None:  # the tokens outside are below the k-th logit: cut by top-k anyway
            ids, values = found
            return ids[race(allowed_probs(values, params), gen)]
    return block_race(allowed_probs(logits, params), gen)
