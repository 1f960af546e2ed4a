"""experiments/policy_gap.py: the order-shuffled trace keeps every token's routing and moves only decode rows within
their sequence; the per-layer excess sums to the replays' totals and equals each layer's misses counted from the
Plans; the one-line CLI errors."""

from __future__ import annotations

import numpy as np

from freetoken.experiments.policy_gap import main, per_layer_excess, shuffled
from freetoken.experiments.policy_hints import replay
from freetoken.placement import Split
from freetoken.sim.run import SimConfig, simulate
from freetoken.trace import DECODE, PREFILL, RoutingTrace


def two_sequences(seed: int = 0) -> RoutingTrace:
    rng = np.random.default_rng(seed)
    T, L, E = 40, 3, 6
    experts = np.stack([rng.permutation(E)[:2] for _ in range(T * L)]).reshape(T, L, 2).astype(np.int16)
    request = np.repeat([0, 1], T // 2).astype(np.int32)
    phase = np.tile(np.r_[np.full(4, PREFILL), np.full(T // 2 - 4, DECODE)], 2).astype(np.int8)
    return RoutingTrace(experts, E, request=request, phase=phase)


def test_shuffle_moves_only_decode_rows_within_their_sequence():
    t = two_sequences()
    s = shuffled(t, seed=1)
    assert (s.phase == t.phase).all() and (s.request == t.request).all()
    prefill = t.phase == PREFILL
    assert (s.experts[prefill] == t.experts[prefill]).all()
    assert not (s.experts == t.experts).all()  # something moved
    for r in (0, 1):  # each sequence's decode routing is the same multiset of rows
        rows = (t.request == r) & (t.phase == DECODE)
        key = lambda x: sorted(map(bytes, x[rows].reshape(rows.sum(), -1)))  # noqa: E731
        assert key(s.experts) == key(t.experts)


def test_per_layer_excess_sums_to_the_replays_difference():
    t = two_sequences(2)
    opts = {"decay": 0.9, "prior": None}
    excess = per_layer_excess(t, 0.5, 4, opts)
    total = replay(t, "layer_sweep", 0.5, 4, opts)[1] - replay(t, "belady", 0.5, 4, {})[1]
    assert excess.shape == (3,) and excess.sum() == total

    def layer_misses(policy, options):  # each layer's misses counted from the Plans, call by call
        config = SimConfig(policy, Split("offload"), fraction=0.5, prefill_chunk=4, options=options)
        out = np.zeros(3, np.int64)
        for plan in simulate(t, config, keep_plans=True).plans:
            out[plan.layer] += len(plan.fetch) + len(plan.cpu)
        return out

    expected = layer_misses("layer_sweep", opts) - layer_misses("belady", {})
    assert len(set(expected.tolist())) > 1  # the layers differ: a misattributed layer would show
    np.testing.assert_array_equal(excess, expected)


def test_cli_errors_are_one_line(capsys, tmp_path):
    assert main(["--cases", "synthetic/48x128-top8"]) == 2
    assert main(["--cases", "deepseek-v2-lite", "--traces", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --cases: not a real-trace case: synthetic/48x128-top8",
                   f"error: --traces: {tmp_path / 'none'} is not a directory"]


def test_doc_that_cannot_be_written_is_one_line_and_the_old_doc_stays(capsys, tmp_path, monkeypatch):
    import freetoken.experiments.policy_gap as gap

    monkeypatch.setattr(gap, "case_rows", lambda name, root: [])  # no real traces needed for the write
    (tmp_path / "notes").write_text("mine\n")
    doc = tmp_path / "notes" / "gap.md"
    assert main(["--cases", "deepseek-v2-lite", "--traces", str(tmp_path), "--doc", str(doc)]) == 2
    assert capsys.readouterr().err == f"error: {doc}: cannot write ({tmp_path / 'notes'} is a file, not a folder)\n"
    assert (tmp_path / "notes").read_text() == "mine\n"


def test_best_scenario_falls_back_to_drafts_for_one_sequence():
    from freetoken.experiments.policy_gap import BEST, best_scenario

    t = two_sequences(3)
    opts = {"decay": 0.9, "prior": None}
    both = best_scenario(t, 0.5, 4, opts)
    assert both["step scenario"] == BEST.label and both["step probe"] is not None
    assert both["step belady"] == replay(t, "belady", 0.5, 4, {}, scenario=BEST.sim_fields())[1]
    one = t.select(t.request == 0)
    alone = best_scenario(one, 0.5, 4, opts)
    drafts = dict(batch=1, draft_depth=BEST.draft_depth, acceptance=BEST.acceptance)
    assert alone["step scenario"] == "drafts"
    assert alone["step belady"] == replay(one, "belady", 0.5, 4, {}, scenario=drafts)[1]
