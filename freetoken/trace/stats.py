"""Summary statistics of a routing trace: popularity and reuse.

Popularity skew is per layer (which experts a layer's router favours); reuse distance is over the key stream a
cache sees, key = layer * num_experts + expert: the number of accesses between two uses of one key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from freetoken.placement.stream import previous_occurrence
from freetoken.trace.format import RoutingTrace

TOP_SHARES = (0.10, 0.25)
PERCENTILES = (50, 90, 99)


def expert_counts(trace: RoutingTrace) -> np.ndarray:
    """[L, E]: how many tokens picked each expert at each layer."""
    E = trace.num_experts
    counts = [np.bincount(trace.experts[:, layer].reshape(-1), minlength=E) for layer in range(trace.num_layers)]
    return np.stack(counts) if counts else np.zeros((0, E), np.int64)  # a layer at a time: no [T, L, K] temporary


# popularity
def top_share(counts: np.ndarray, fraction: float) -> np.ndarray:
    """counts [L, E] -> [L]: share of a layer's accesses taken by its ceil(fraction * E) most used experts."""
    E = counts.shape[1]
    n = max(1, int(np.ceil(fraction * E - 1e-9)))
    top = -np.sort(-counts, axis=1)[:, :n].sum(axis=1)
    return top / np.maximum(counts.sum(axis=1), 1)


def gini(counts: np.ndarray) -> np.ndarray:
    """counts [L, E] -> [L]: Gini coefficient of each layer's expert counts (0 = uniform, 1 - 1/E = one expert)."""
    E = counts.shape[1]
    x = np.sort(counts, axis=1).astype(np.float64)
    rank = np.arange(1, E + 1, dtype=np.float64)
    total = np.maximum(x.sum(axis=1), 1e-300)
    return 2.0 * (x * rank).sum(axis=1) / (E * total) - (E + 1) / E


def normalized_entropy(counts: np.ndarray) -> np.ndarray:
    """counts [L, E] -> [L]: entropy of each layer's popularity over log(E) (1 = uniform)."""
    p = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * np.log(p), 0.0).sum(axis=1)
    return h / np.log(counts.shape[1]) if counts.shape[1] > 1 else np.ones(len(counts))


@dataclass(frozen=True, slots=True)
class Skew:
    """Per-layer popularity, [L] each."""

    top10: np.ndarray
    top25: np.ndarray
    gini: np.ndarray
    entropy: np.ndarray

    def summary(self) -> dict:
        """mean / min / max over layers of each measure."""
        return {name: {"mean": float(v.mean()), "min": float(v.min()), "max": float(v.max())}
                for name, v in asdict(self).items()}


def popularity_skew(trace: RoutingTrace) -> Skew:
    c = expert_counts(trace)
    return Skew(top_share(c, TOP_SHARES[0]), top_share(c, TOP_SHARES[1]), gini(c), normalized_entropy(c))


# reuse
def access_keys(trace: RoutingTrace, prefill_chunk: int = 1) -> np.ndarray:
    """[N] keys in the order a cache sees them. prefill_chunk=1: every token is its own call (token-granular,
    built directly from experts [T, L, K]); larger: the simulator's calls (sim.calls.trace_calls)."""
    if prefill_chunk == 1:
        L, E = trace.num_layers, trace.num_experts
        keys = trace.experts.astype(np.int64) + (np.arange(L, dtype=np.int64) * E)[None, :, None]  # [T, L, K]
        return keys.reshape(-1)
    from freetoken.sim.calls import trace_key_stream

    return trace_key_stream(trace, prefill_chunk).keys


def reuse_distances(keys: np.ndarray) -> np.ndarray:
    """[N] -> [N]: accesses strictly between this use of a key and its previous use; -1 for a first (cold) use."""
    prev = previous_occurrence(keys)
    return np.where(prev >= 0, np.arange(len(keys)) - prev - 1, -1)


def token_reuse_distances(trace: RoutingTrace) -> np.ndarray:
    """reuse_distances(access_keys(trace, 1)), a layer at a time: a key only recurs within its layer, and L sorts
    of T * K small ids beat one sort of T * L * K keys (about 3x on 192k tokens)."""
    T, L, K = trace.experts.shape
    t, slot = np.divmod(np.arange(T * K, dtype=np.int64), K)  # [T * K] token and slot of each pick
    out = np.empty((T, L, K), np.int64)
    for layer in range(L):
        ids = np.ascontiguousarray(trace.experts[:, layer]).reshape(-1)  # [T * K]
        pos = t * (L * K) + layer * K + slot  # where each pick sits in the token-granular stream
        prev = previous_occurrence(ids)
        out[:, layer] = np.where(prev >= 0, pos - pos[prev] - 1, -1).reshape(T, K)
    return out.reshape(-1)


@dataclass(frozen=True, slots=True)
class Reuse:
    accesses: int
    cold_share: float  # first uses over all accesses
    percentiles: dict[int, float]  # of the reuse distance over warm accesses

    def to_dict(self) -> dict:
        return {"accesses": self.accesses, "cold_share": self.cold_share,
                **{f"p{q}": v for q, v in self.percentiles.items()}}


def reuse_stats(trace: RoutingTrace, prefill_chunk: int = 1) -> Reuse:
    d = token_reuse_distances(trace) if prefill_chunk == 1 else reuse_distances(access_keys(trace, prefill_chunk))
    warm = d[d >= 0]
    pct = {q: float(np.percentile(warm, q)) if warm.size else float("nan") for q in PERCENTILES}
    return Reuse(int(d.size), float((d < 0).mean()) if d.size else 0.0, pct)
