"""The uncertainty band of a prediction: the same prediction under the routing locality of other real traces.

Routing locality decides how often an expert cache hits, and it is the one input no card or profile gives. A
prediction is therefore shown with the spread it takes under the localities of the real traces the project ships,
matched at the model's shape (sim.synth: Zipf skew matched by per-layer Gini, reuse and window fitted), and none.
"""

from __future__ import annotations

from freetoken.sim.prediction import Prediction

# Routing-locality proxies: the per-layer Gini of a real trace matched by the Zipf exponent at 256 experts / top-8
# (sim.synth.skew_curve, _invert), reuse and window from sim.synth.fit_spec on the same trace. tests/test_anchors.py
# re-derives Granite's row from the shipped trace.
ROUTINGS: dict[str, dict] = {
    "pinned": {},  # the synthetic default: DeepSeek-V2-Lite (prefill order of 1,999 prompts): skew 0.25, reuse 0.8
    "granite decode": dict(skew=0.55, reuse=0.8, window=16),  # Granite-3.0-1B-A400M decode steps: Gini 0.334
    "mixtral": dict(skew=0.26, reuse=0.5, window=6),  # Mixtral-8x7B humaneval_2 (vLLM): Gini 0.147
    "uniform": dict(skew=0.0, reuse=0.0),  # no skew, no reuse: the locality floor
}
PROXIES = ("granite decode", "mixtral", "uniform")
METRICS = ("decode_tok_s", "prefill_tok_s", "ttft_s", "turn_latency_worst_s")


def band_of(point: Prediction, others: dict[str, Prediction]) -> dict:
    """{metric: [low, high]} over the point and the proxies, plus each proxy's value."""
    out = {}
    for m in METRICS:
        values = [getattr(point, m)] + [getattr(p, m) for p in others.values()]
        out[m] = [min(values), max(values)]
    out["by_routing"] = {name: {m: getattr(p, m) for m in METRICS} for name, p in others.items()}
    return out


def locality_band(card, hw, engine, make_trace, point: Prediction, warmup_decode: int = 0, **predict_kw) -> dict:
    """Predict again on the point's workload drawn under each proxy locality (warm-up as the point's).
    make_trace(**routing) -> the workload's synthetic trace with warmup_decode more decode steps at its end."""
    from freetoken.sim.predict import predict, warmup_split

    others = {}
    for name in PROXIES:
        trace = make_trace(**ROUTINGS[name])
        warm = None
        if warmup_decode:
            trace, warm = warmup_split(trace, warmup_decode)
        others[name] = predict(card, hw, engine, trace, warmup=warm, **predict_kw)
    return band_of(point, others)
