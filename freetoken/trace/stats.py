"""Popularity of a routing trace's experts, per layer (which experts a layer's router favours).

Reuse distances are over the key stream a cache sees, which the simulator builds: sim.reuse.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from freetoken.trace.format import RoutingTrace

TOP_SHARES = (0.10, 0.25)


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


# router hint
def hint_accuracy(trace: RoutingTrace) -> np.ndarray:
    """[L]: per layer, the mean over tokens of the share of the true top-k that the recorded hint predicted
    (|hint & experts| / K); nan where the layer holds no prediction (layer 0, or a trace without a hint)."""
    L, K = trace.num_layers, trace.top_k
    out = np.full(L, np.nan)
    if trace.hint is None or not trace.num_tokens:
        return out
    hint, ex = trace.hint, trace.experts
    for layer in range(L):
        made = (hint[:, layer] >= 0).all(axis=1)  # [T] tokens with a prediction of this layer
        if made.any():
            hit = (ex[made, layer][:, :, None] == hint[made, layer][:, None, :]).any(axis=2)  # [T', K]
            out[layer] = hit.sum() / (made.sum() * K)
    return out


def draft_acceptance(trace: RoutingTrace) -> float:
    """Accepted drafted tokens / drafted tokens of the trace's verify calls (nan without drafts)."""
    if trace.draft is None:
        return float("nan")
    accepted, rejected = int((trace.draft == 1).sum()), int((trace.draft == 2).sum())
    return accepted / (accepted + rejected) if accepted + rejected else float("nan")



def forward_spans(trace: RoutingTrace, prefill_chunk: int) -> list[tuple[int, int]]:
    """[lo, hi) token spans of the engine's forwards, in order: each run of one request / turn / phase in prefill
    chunks of prefill_chunk tokens; in decode one token per forward, or with the draft field a verify call's tokens
    (a token marked 0 and the drafted tokens 1 / 2 after it)."""
    T = trace.num_tokens
    draft = trace.draft if trace.draft is not None else np.zeros(T, np.int8)
    out: list[tuple[int, int]] = []
    lo = 0
    while lo < T:
        hi = lo + 1
        same = lambda t: (trace.request[t] == trace.request[lo] and trace.turn[t] == trace.turn[lo]  # noqa: E731
                          and trace.phase[t] == trace.phase[lo])
        if trace.phase[lo] == 0:
            while hi < T and hi - lo < prefill_chunk and same(hi):
                hi += 1
        else:
            while hi < T and draft[hi] != 0 and same(hi):
                hi += 1
        out.append((lo, hi))
        lo = hi
    return out
