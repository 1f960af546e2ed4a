"""Synthetic routing traces for model shapes no recorded trace covers, and a fit of their knobs to a real trace.

Each layer's router favours experts by a Zipf law over a per-layer random ranking (`skew` = the exponent, 0 =
uniform); top-k picks are drawn without replacement (an exponential race, as Gumbel top-k). Temporal reuse: each top-k slot, with
probability `reuse`, re-picks an expert that one of the previous `window` tokens of the same request used at the
same layer; the remaining slots are drawn by popularity. Requests have a prefill then a decode phase.
Generation loops over token positions and is vectorised over requests and layers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from freetoken.trace.format import DECODE, MAX_EXPERTS, PREFILL, RoutingTrace

MAX_SKEW = 10.0  # E ** MAX_SKEW stays finite in float32 for any realistic expert count


@dataclass(frozen=True, slots=True)
class SynthSpec:
    num_layers: int
    num_experts: int
    top_k: int
    num_tokens: int
    num_requests: int = 4
    prefill_share: float = 0.5  # of each request's tokens; the rest are decode steps
    skew: float | tuple[float, ...] = 1.0  # Zipf exponent, one for all layers or one per layer
    reuse: float = 0.3  # probability that a top-k slot re-picks an expert of the previous `window` tokens
    window: int = 4
    seed: int = 0
    model: str = "synthetic"

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_experts", "top_k", "num_tokens", "num_requests", "window"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.num_experts > MAX_EXPERTS:
            raise ValueError(f"num_experts {self.num_experts} exceeds {MAX_EXPERTS}: a trace holds expert ids as "
                             f"int16")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k {self.top_k} exceeds num_experts {self.num_experts}")
        if self.num_requests > self.num_tokens:
            raise ValueError(f"num_requests {self.num_requests} exceeds num_tokens {self.num_tokens}")
        if not 0 <= self.prefill_share <= 1:
            raise ValueError(f"prefill_share must lie in [0, 1], got {self.prefill_share}")
        if not 0 <= self.reuse <= 1:
            raise ValueError(f"reuse must lie in [0, 1], got {self.reuse}")
        skews = self.layer_skews()
        if len(skews) != self.num_layers:
            raise ValueError(f"skew gives {len(skews)} per-layer exponents for {self.num_layers} layers")
        if not np.all(np.isfinite(skews)) or (skews < 0).any() or (skews > MAX_SKEW).any():
            raise ValueError(f"skew exponents must lie in [0, {MAX_SKEW}], got {self.skew}")
        if not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")

    def layer_skews(self) -> np.ndarray:
        """[L] Zipf exponent of each layer."""
        if isinstance(self.skew, (tuple, list)):
            return np.asarray(self.skew, np.float64)
        return np.full(self.num_layers, float(self.skew))

    def request_lengths(self) -> np.ndarray:
        """[R] tokens per request: equal, the remainder to the first requests."""
        base, extra = divmod(self.num_tokens, self.num_requests)
        return np.full(self.num_requests, base) + (np.arange(self.num_requests) < extra)


def layer_log_popularity(spec: SynthSpec, rng: np.random.Generator) -> np.ndarray:
    """[L, E] log-weights: Zipf over ranks, ranks permuted per layer (each layer has its own hot experts)."""
    L, E = spec.num_layers, spec.num_experts
    by_rank = -spec.layer_skews()[:, None] * np.log(np.arange(1, E + 1))[None, :]  # [L, E]
    hot = np.argsort(rng.random((L, E)), axis=1)  # [L, E] expert at each rank
    logp = np.empty((L, E))
    np.put_along_axis(logp, hot, by_rank, axis=1)
    return logp


def synthesize(spec: SynthSpec) -> RoutingTrace:
    # R = requests, P = positions (longest request), L = layers, E = experts, K = top-k
    rng = np.random.default_rng(spec.seed)
    R, L, E, K, W = spec.num_requests, spec.num_layers, spec.num_experts, spec.top_k, spec.window
    lengths = spec.request_lengths()  # [R]
    P = int(lengths.max())
    inv_p = np.exp(-layer_log_popularity(spec, rng)).astype(np.float32)  # [L, E] 1 / weight
    picks = np.zeros((R, P, L, K), np.int16)
    r_idx = np.arange(R)[:, None, None]  # [R, 1, 1]
    l_idx = np.arange(L)[None, :, None]  # [1, L, 1]
    draw = np.empty((R, L, E), np.float32)
    race = np.empty((R, L, E + 1), np.float32)  # column E absorbs the writes of slots that do not reuse
    for p in range(P):
        # Exp(1) / weight: the K smallest are a weighted draw without replacement (as Gumbel top-k)
        rng.standard_exponential(out=draw, dtype=np.float32)
        np.multiply(draw, inv_p, out=race[..., :E])
        if p and spec.reuse > 0:
            back = rng.integers(1, min(W, p) + 1, size=(R, L, K))  # [R, L, K] tokens back
            slot = rng.integers(0, K, size=(R, L, K))
            again = picks[r_idx, p - back, l_idx, slot]  # [R, L, K] experts used recently
            again = np.where(rng.random((R, L, K)) < spec.reuse, again, E)
            np.put_along_axis(race, again, -1.0, axis=2)  # re-picked experts win the race
        keys = race[..., :E]
        top = np.argpartition(keys, K - 1, axis=2)[..., :K]  # [R, L, K]
        order = np.argsort(np.take_along_axis(keys, top, axis=2), axis=2, kind="stable")
        picks[:, p] = np.take_along_axis(top, order, axis=2)
    pos = np.arange(P)[None, :]
    valid = pos < lengths[:, None]  # [R, P]
    n_prefill = np.floor(lengths * spec.prefill_share + 0.5).astype(np.int64)  # [R]
    phase = np.where(pos < n_prefill[:, None], PREFILL, DECODE).astype(np.int8)
    request = np.broadcast_to(np.arange(R, dtype=np.int32)[:, None], (R, P))
    extra = {"synth_spec": _spec_string(spec)}
    return RoutingTrace(picks[valid], E, model=spec.model, source="synthetic",
                        request=request[valid], phase=phase[valid], extra=extra)


def _spec_string(spec: SynthSpec) -> str:
    import json
    from dataclasses import asdict

    d = asdict(spec)
    d["skew"] = [round(float(s), 4) for s in spec.layer_skews()] if isinstance(spec.skew, tuple) else spec.skew
    return json.dumps(d)


# fit
SKEW_GRID = np.round(np.arange(0.0, 3.0001, 0.05), 2)
REUSE_GRID = np.round(np.arange(0.0, 0.91, 0.1), 2)  # coarse; the best is refined by +-0.05
WINDOW_GRID = (1, 2, 3, 4, 6, 8, 12, 16)
FIT_TOKENS = 4000  # synthetic tokens per candidate of the reuse grid search
FIT_CANDIDATES = 1 + (len(REUSE_GRID) - 1) * len(WINDOW_GRID) + 2
FIT_POSITIONS = 256  # longest candidate request (generation time grows with positions, not requests)


def skew_curve(num_experts: int, top_k: int, num_tokens: int, seed: int = 0) -> np.ndarray:
    """[len(SKEW_GRID)]: Gini of one layer's counts over num_tokens draws, per Zipf exponent (common random
    numbers, so the curve is smooth; it includes the sampling noise a trace of that length shows)."""
    from freetoken.trace.stats import gini

    rng = np.random.default_rng(seed)
    n = min(num_tokens, 20000)
    race = rng.standard_exponential((n, num_experts))  # [n, E]
    log_rank = np.log(np.arange(1, num_experts + 1))
    out = np.empty(len(SKEW_GRID))
    for i, s in enumerate(SKEW_GRID):
        top = np.argpartition(race * np.exp(s * log_rank), top_k - 1, axis=1)[:, :top_k]
        out[i] = gini(np.bincount(top.reshape(-1), minlength=num_experts)[None, :])[0]
    return np.maximum.accumulate(out)


def _invert(curve: np.ndarray, target: np.ndarray) -> tuple[float, ...]:
    lo = np.searchsorted(curve, curve[0], side="right") - 1  # last grid point still on the noise floor
    return tuple(float(round(v, 3)) for v in np.interp(target, curve[lo:], SKEW_GRID[lo:]))


def _reuse_loss(a, b) -> float:
    return sum((np.log1p(a.percentiles[q]) - np.log1p(b.percentiles[q])) ** 2 for q in (50, 90))


def fit_spec(trace: RoutingTrace, seed: int = 0, on_candidate=None) -> SynthSpec:
    """A SynthSpec of the trace's shape whose per-layer skew (Gini) and token-granular reuse-distance p50 / p90
    match the trace's: skew by inverting a simulated Gini curve, reuse and window by a small grid search, then
    one correction of the skew for the sampling noise that reuse adds (short traces only). on_candidate() is
    called after each of the FIT_CANDIDATES grid points (for a progress bar)."""
    from freetoken.trace.stats import expert_counts, gini
    from freetoken.sim.reuse import reuse_stats

    T = trace.num_tokens
    R = len(np.unique(trace.request))
    curve = skew_curve(trace.num_experts, trace.top_k, T, seed)
    target_gini = gini(expert_counts(trace))  # [L]
    spec = SynthSpec(trace.num_layers, trace.num_experts, trace.top_k, T, num_requests=R,
                     prefill_share=float((trace.phase == PREFILL).mean()), skew=_invert(curve, target_gini),
                     seed=seed, model=f"synthetic-fit:{trace.model}")
    target = reuse_stats(trace)
    n = min(T, FIT_TOKENS)
    small = replace(spec, num_tokens=n, num_requests=min(n, max(round(R * n / T), -(-n // FIT_POSITIONS), 1)))

    def loss(reuse: float, window: int) -> float:
        if on_candidate is not None:
            on_candidate()
        return _reuse_loss(reuse_stats(synthesize(replace(small, reuse=reuse, window=window))), target)

    grid = [(0.0, 1)] + [(float(r), w) for w in WINDOW_GRID for r in REUSE_GRID if r > 0]
    scores = {c: loss(*c) for c in grid}
    best_r, best_w = min(scores, key=scores.get)
    for r in (best_r - 0.05, best_r + 0.05):
        if 0 < r <= 1:
            scores[(round(r, 2), best_w)] = loss(round(r, 2), best_w)
    best_r, best_w = min(scores, key=scores.get)
    spec = replace(spec, reuse=best_r, window=best_w)
    if T <= 20000:  # correlated picks add count noise: move each layer's target by the gap the fit shows
        got = gini(expert_counts(synthesize(spec)))
        spec = replace(spec, skew=_invert(curve, np.clip(2 * target_gini - got, 0, None)))
    return spec
