"""Regression pins of the published anchor cells: every prediction held within its pin (the error this version
makes, rounded up to 5 points, plus 5: a change that moves a cell shows), every miss beyond the accuracy goal
explained, and the anchors' qualitative facts reproduced by the physics alone. The accuracy goal itself is asserted
in tests/test_anchor_accuracy.py."""

import pytest

from freetoken.sim import anchors


@pytest.fixture(scope="module")
def cells(anchor_cells):
    return anchor_cells


def test_every_seed_cell_is_predicted_within_its_pin(cells):
    assert len(cells) == 2 * len(anchors.seed_rows())
    for c in cells:
        assert (c.label, c.metric) in anchors.PINS, f"{c.label} {c.metric} has no regression pin"
        assert abs(c.error) <= c.pin, f"{c.label} {c.metric}: predicted {c.predicted:.1f}, published " \
                                      f"{c.published}, error {c.error:+.1%} beyond its pin {c.pin:.0%}"


def test_every_miss_says_why_and_no_pin_is_slack(cells):
    for c in cells:
        if not c.within_target:
            assert (c.label, c.metric) in anchors.NOTES, f"{c.label} {c.metric} misses without a reason"
        # a pin holds the current error: at most 10 points above it
        assert c.pin - abs(c.error) <= 0.10, f"{c.label} {c.metric}: pin {c.pin} is slack"


def test_hybrid_helps_prefill_not_decode(cells):
    # facts.md: FreeToken's hybrid helped prefill but not decode (one token hides no CPU latency). Prefill: this
    # engine's own hybrid split (a CPU lane in prefill, no double buffer), not the hybrid row's, which charges
    # FreeToken 0.1.2's hybrid prefill (no CPU lane: FREETOKEN_012_HYBRID_PREFILL), set against offload at the same
    # settings (the row's others)
    from freetoken.sim.engines import FREETOKEN_012_HYBRID_PREFILL, get_engine, with_settings
    from freetoken.sim.hardware import load_hardware
    from freetoken.sim.model_card import load_model_card

    get = {(c.engine, c.metric): c.predicted for c in cells if c.hardware == "rtx5090-ryzen"}
    row = anchors.CELLS[("ryzen", "FreeToken", "hybrid")]
    own = {k: v for k, v in row.settings.items() if k not in FREETOKEN_012_HYBRID_PREFILL}
    hybrid, offload = (with_settings(get_engine(name), **own) for name in ("freetoken-hybrid", "freetoken-offload"))
    assert hybrid.prefill_split == "same" and not hybrid.double_buffer and not offload.double_buffer
    card = load_model_card(anchors.MODEL)
    hw, traces = load_hardware(row.hardware), anchors._Traces(card, row.prompt)
    mine, theirs = (anchors.measured_rates(card, hw, e, traces, row.prompt, "pinned")["prefill_tok_s"]
                    for e in (hybrid, offload))
    assert mine > 1.05 * theirs
    assert get["freetoken-hybrid", "decode_tok_s"] == pytest.approx(get["freetoken-offload", "decode_tok_s"], rel=0.05)


def test_offload_beats_all_cpu_on_the_review_box(cells):
    # the ordering of the published ryzen rows: FreeToken (offload, hybrid) > llama.cpp -cmoe, in both phases
    get = {(c.engine, c.metric): c.predicted for c in cells if c.hardware == "rtx5090-ryzen"}
    for metric in ("decode_tok_s", "prefill_tok_s"):
        assert get["freetoken-offload", metric] > get["llamacpp-cmoe", metric]


def test_warm_server_rates_are_the_measured_requests_own_calls():
    # reference: one replay of warm-up + measured request, each call charged, request 1's calls summed by hand
    from freetoken.sim.cost import call_meta, charge
    from freetoken.sim.engines import get_engine
    from freetoken.sim.hardware import load_hardware
    from freetoken.sim.model_card import load_model_card
    from freetoken.sim.planner import plan_for, policy_capacity
    from freetoken.sim.run import SimConfig, simulate

    card, hw, engine = load_model_card(anchors.MODEL), load_hardware("rtx5090-ryzen"), get_engine("freetoken-offload")
    traces = anchors._Traces(card, 2048)
    got = anchors.measured_rates(card, hw, "freetoken-offload", traces, 2048, "pinned")
    trace = traces.get(2048, "pinned")
    assert (trace.request == 0).sum() == anchors.DECODE_TOKENS and (trace.phase[trace.request == 0] == 1).all()
    q = card.with_quant(engine.expert_quant, engine.dense_quant, engine.compute_dtype)
    config = SimConfig("lru", engine.split_for(q, hw), capacity=policy_capacity(plan_for(q, hw), q),
                       prefill_chunk=engine.prefill_chunk, expert_bytes=q.expert_bytes())
    log = simulate(trace, config).log
    from freetoken.sim.overhead import host_work
    from freetoken.sim.predict import layer_shape

    work = host_work(engine.host_work, log, q.num_layers, layer_shape(q), cuda_graphs=engine.cuda_graphs)
    t = charge(log, call_meta(trace, engine.prefill_chunk), q, hw, engine.cost_options("shared"), work).seconds
    mine = log.request == 1
    assert got["prefill_tok_s"] == pytest.approx(2048 / t[mine & (log.phase == 0)].sum(), rel=1e-9)
    assert got["decode_tok_s"] == pytest.approx(anchors.DECODE_TOKENS / t[mine & (log.phase == 1)].sum(), rel=1e-9)
    # streaming prefill on a warm cache: the chunk hits what the warm-up's decode left resident
    assert log.hits[mine & (log.phase == 0)].sum() > 0


@pytest.mark.slow
def test_granite_locality_proxy_is_rederived_from_the_real_trace(shared_traces):
    # ROUTINGS["granite decode"]: Gini of the decode steps matched at 256 experts / top-8; reuse, window fitted
    import numpy as np

    from freetoken.trace import DECODE
    from freetoken.trace.importers import import_trace
    from freetoken.trace.stats import expert_counts, gini
    from freetoken.sim.synth import _invert, fit_spec, skew_curve

    g = import_trace(shared_traces / "granite-3.0-1b-a400m" / "moe_expert_trace.json")
    decode = g.select(np.flatnonzero(g.phase == DECODE))
    want = anchors.ROUTINGS["granite decode"]
    skew = np.mean(_invert(skew_curve(256, 8, 20000), gini(expert_counts(decode))))
    assert skew == pytest.approx(want["skew"], abs=0.01)
    spec = fit_spec(decode)
    assert (spec.reuse, spec.window) == (want["reuse"], want["window"])
