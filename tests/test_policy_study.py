"""experiments.policy_study on a tiny synthetic case: the rows are the replays they claim to be, the fit sees only
the profile, and bad arguments fail in one line."""

from pathlib import Path

import numpy as np
import pytest

from freetoken.experiments import policy_study as ps
from freetoken.placement import Split
from freetoken.trace.stats import expert_counts
from freetoken.sim.run import SimConfig, simulate
from freetoken.sim.synth import SynthSpec, synthesize


def _case():
    trace = synthesize(SynthSpec(num_layers=4, num_experts=8, top_k=2, num_tokens=160, num_requests=4, seed=4))
    return ps.Case("tiny", 16, False, lambda root: ps._request_folds(trace, [[0, 1], [2, 3]], "tiny")), trace


def test_rows_are_sums_of_out_of_sample_replays(monkeypatch):
    case, trace = _case()
    fitted_on = []
    real_fit = ps.fit_decay

    def spy(profile, fraction, chunk):
        fitted_on.append(sorted(np.unique(profile.request).tolist()))
        return real_fit(profile, fraction, chunk)

    monkeypatch.setattr(ps, "fit_decay", spy)
    rows = ps.run_case(case, Path("."), [0.25], ps.ONLINE)
    assert fitted_on == [[2, 3], [0, 1]]  # fold 1 evaluates requests 0, 1 and fits on 2, 3; then the reverse
    by = {r["policy"]: r for r in rows}
    # independent: the two folds replayed here directly
    halves = [trace.select(np.isin(trace.request, g)) for g in ([0, 1], [2, 3])]
    lru = sum(simulate(h, SimConfig("lru", Split("offload"), fraction=0.25, prefill_chunk=16)).total.misses
              for h in halves)
    freq = sum(simulate(h, SimConfig("frequency", Split("offload"), fraction=0.25, prefill_chunk=16,
                                     options={"profile": expert_counts(o)})).total.misses
               for h, o in zip(halves, halves[::-1]))
    belady = sum(simulate(h, SimConfig("belady", Split("offload"), fraction=0.25, prefill_chunk=16)).total.misses
                 for h in halves)
    assert by["lru"]["misses"] == lru and by["frequency"]["misses"] == freq
    assert by["belady"]["misses"] == belady == by["lru"]["belady_misses"]
    la = by["lookahead"]
    assert la["prefetched"] > 0 and la["transfers"] == la["misses"] + la["prefetched"]
    assert la["ratio_to_belady"] == pytest.approx(la["transfers"] / belady)
    assert "requests 2-3" not in by["lru"]["profile_source"] and "tiny" in by["frequency"]["profile_source"]
    assert set(rows[0]) == set(ps.COLUMNS)


def test_outputs_are_written_and_the_doc_has_every_policy(tmp_path):
    case, _ = _case()
    rows = ps.run_case(case, Path("."), [0.25, 0.5], ps.ONLINE)
    ps.write_outputs(rows, tmp_path / "r.csv", tmp_path / "d.md")
    import pandas as pd

    frame = pd.read_csv(tmp_path / "r.csv")
    assert len(frame) == 2 * (len(ps.ONLINE) + 1)
    doc = (tmp_path / "d.md").read_text()
    head = next(line for line in doc.splitlines() if line.startswith("| residency"))
    assert all(p in head for p in ps.ONLINE + ("belady",))


def test_bad_arguments_fail_in_one_line(capsys):
    assert ps.main(["--only", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown case nope" in err
    assert ps.main(["--only", "synthetic/48x128-top8", "--fractions", "1.5"]) == 2
    assert "--fractions" in capsys.readouterr().err


def _hydra_cfg(results, case, fraction, **values):
    from freetoken.experiments.compose import compose, shrink

    cfg = compose(["experiment=policy_study", f"study.case={case}", f"study.fraction={fraction}"])
    return shrink(cfg, **{"results.dir": str(results), "results.progress": False, **values})


@pytest.mark.slow
def test_hydra_runs_write_rows_and_a_report_in_results_not_docs(tmp_path, monkeypatch):
    """One run per (case, fraction) through the Hydra config: its rows are run_case's, the report in the results dir
    keeps every finished case (the argparse study rewrote docs/ with only the cases of the last call), a finished
    run is skipped, and a tracked doc is written only when study.doc names it."""
    import pandas as pd

    from freetoken.paths import REPO_ROOT

    case, _ = _case()
    monkeypatch.setitem(ps.CASES, "tiny", case)
    monkeypatch.setitem(ps.CASES, "tiny2", ps.Case("tiny2", 8, False, case.folds))
    tracked = REPO_ROOT / "docs" / "policy_study.md"
    before = tracked.read_bytes()
    results = tmp_path / "results"
    ps.run_study(_hydra_cfg(results, "tiny", 0.25))
    ps.run_study(_hydra_cfg(results, "tiny2", 0.5))
    rows = pd.read_parquet(results / "policy_study_policies.parquet")
    want = pd.DataFrame(ps.run_case(case, Path("."), [0.25], ps.ONLINE, scenarios=ps.SCENARIOS),
                        columns=list(ps.COLUMNS))
    got = rows[rows.trace == "tiny"][list(ps.COLUMNS)].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    report = (results / "policy_study.md").read_text()
    assert "## tiny\n" in report and "## tiny2\n" in report
    assert report == ps.render(rows.sort_values(["trace", "fraction"])[list(ps.COLUMNS)].reset_index(drop=True))
    assert tracked.read_bytes() == before

    calls = []
    monkeypatch.setattr(ps, "run_case", lambda *a, **k: calls.append(a) or [])
    ps.run_study(_hydra_cfg(results, "tiny", 0.25))
    assert calls == []  # finished: skipped, report rebuilt
    doc = tmp_path / "doc.md"
    ps.run_study(_hydra_cfg(results, "tiny", 0.25, **{"study.doc": str(doc)}))
    assert doc.read_text() == report


def test_hydra_study_config_errors_name_the_key(tmp_path):
    from freetoken.experiments.runner import build

    with pytest.raises(ValueError, match=r"^study\.case: unknown case nope; valid: mixtral-8x7b/gsm8k_2_routing"):
        build(_hydra_cfg(tmp_path, "nope", 0.25), "study")
    with pytest.raises(ValueError, match=r"^study\.fraction must lie in \(0, 1\], got 1\.5"):
        build(_hydra_cfg(tmp_path, "deepseek-v2-lite", 1.5), "study")
    cfg = _hydra_cfg(tmp_path, "deepseek-v2-lite", 0.25, **{"study.traces": str(tmp_path / "none")})
    with pytest.raises(ValueError, match=r"^study\.traces: .*none is not a directory of traces"):
        ps.validate(cfg)


def test_scenario_rows_are_the_scenarios_replays():
    """Batch and draft rows: the folds replayed here with the scenario's SimConfig, Belady on the same calls;
    ktransformers_dynamic reads the other fold's counts (out of sample)."""
    case, trace = _case()
    rows = ps.run_case(case, Path("."), [0.25], ("lru", "ktransformers_dynamic"), scenarios=ps.SCENARIOS)
    halves = [trace.select(np.isin(trace.request, g)) for g in ([0, 1], [2, 3])]
    for sc in ps.SCENARIOS:
        by = {r["policy"]: r for r in rows if r["scenario"] == sc.label}
        for policy in ("lru", "belady"):
            want = sum(simulate(h, SimConfig(policy, Split("offload"), fraction=0.25, prefill_chunk=16,
                                             **sc.sim_fields())).total.misses for h in halves)
            assert by[policy]["misses"] == want, (sc.label, policy)
        kt = sum(simulate(h, SimConfig("ktransformers_dynamic", Split("offload"), fraction=0.25, prefill_chunk=16,
                                       options={"strategy": "frequency"}, **sc.sim_fields()), profile=o).total.misses
                 for h, o in zip(halves, halves[::-1]))
        assert by["ktransformers_dynamic"]["misses"] == kt
    draft = {r["policy"]: r for r in rows if r["scenario"] == "draft 3 a=0.6"}
    solo = {r["policy"]: r for r in rows if r["scenario"] == "solo"}
    assert draft["belady"]["misses"] != solo["belady"]["misses"]  # a scenario's own calls, its own bound


@pytest.mark.slow
def test_hydra_study_scenario_settings_compose_and_validate(tmp_path):
    """conf/study/policy.yaml's scenario settings: the defaults are the grid's, an override changes the scenarios
    a run replays, and a bad value is one line naming its field."""
    from freetoken.experiments.runner import build

    spec = build(_hydra_cfg(tmp_path, "deepseek-v2-lite", 0.25), "study")
    assert spec.scenarios() == ps.SCENARIOS
    assert [s.label for s in ps.SCENARIOS] == ["solo", "batch 4", "batch 8", "draft 3 a=0.6", "draft 3 a=0.8",
                                              "batch 4 draft 3 a=0.6", "batch 4 draft 3 a=0.8",
                                              "batch 8 draft 3 a=0.6", "batch 8 draft 3 a=0.8"]
    spec = build(_hydra_cfg(tmp_path, "deepseek-v2-lite", 0.25, **{"study.batches": [2], "study.draft_depth": 5,
                                                                    "study.acceptances": [0.7]}), "study")
    assert [(s.label, s.batch, s.draft_depth, s.acceptance) for s in spec.scenarios()] == \
        [("solo", 1, 0, 1.0), ("batch 2", 2, 0, 1.0), ("draft 5 a=0.7", 1, 5, 0.7), ("batch 2 draft 5 a=0.7", 2, 5, 0.7)]
    spec = build(_hydra_cfg(tmp_path, "deepseek-v2-lite", 0.25, **{"study.combine": False}), "study")
    assert [s.label for s in spec.scenarios()] == ["solo", "batch 4", "batch 8", "draft 3 a=0.6", "draft 3 a=0.8"]
    bad = [({"study.batches": [1, 4]}, r"^study\.batches: distinct whole numbers >= 2 .*got \[1, 4\]$"),
           ({"study.batches": 4}, r"^study\.batches: a list, got 4$"),
           ({"study.draft_depth": -1}, r"^study\.draft_depth must be a whole number >= 0 .*got -1$"),
           ({"study.acceptances": [0.6, 1.2]}, r"^study\.acceptances: distinct rates in \[0, 1\], got \[0\.6, 1\.2\]$"),
           ({"study.draft_depth": 0}, r"^study\.acceptances need draft_depth >= 1 "),
           ({"study.combine": "yes"}, r"^study\.combine: true or false, got 'yes'$")]
    for values, message in bad:
        with pytest.raises(ValueError, match=message):
            build(_hydra_cfg(tmp_path, "deepseek-v2-lite", 0.25, **values), "study")


def test_configured_scenarios_are_the_rows_a_run_writes(tmp_path, monkeypatch):
    """A run with study.batches=[2], one draft rate: its rows are run_case's on exactly those scenarios."""
    import pandas as pd

    case, _ = _case()
    monkeypatch.setitem(ps.CASES, "tiny", case)
    ps.run_study(_hydra_cfg(tmp_path / "results", "tiny", 0.25, **{"study.batches": [2], "study.draft_depth": 2,
                                                                   "study.acceptances": [0.5]}))
    rows = pd.read_parquet(tmp_path / "results" / "policy_study_policies.parquet")
    assert list(dict.fromkeys(rows.scenario)) == ["solo", "batch 2", "draft 2 a=0.5", "batch 2 draft 2 a=0.5"]
    want = pd.DataFrame(ps.run_case(case, Path("."), [0.25], ps.ONLINE,
                                    scenarios=ps.scenarios((2,), 2, (0.5,))), columns=list(ps.COLUMNS))
    pd.testing.assert_frame_equal(rows[list(ps.COLUMNS)].reset_index(drop=True), want, check_dtype=False)


def test_scenarios_that_crossed_a_process_boundary_run_the_same_rows():
    """Hydra's joblib sweep pickles the scenarios into its workers: an unpickled solo scenario is equal to SOLO, not
    the same object, and must be taken as the solo one (the whole multirun study failed on that)."""
    import pickle

    import pandas as pd

    case, _ = _case()
    shipped = pickle.loads(pickle.dumps(ps.SCENARIOS))
    assert shipped[0] is not ps.SOLO
    frame = lambda sc: pd.DataFrame(ps.run_case(case, Path("."), [0.25], ("lru",), scenarios=sc))  # noqa: E731
    here = frame(ps.SCENARIOS)
    assert set(here.scenario) == {s.label for s in ps.SCENARIOS}
    pd.testing.assert_frame_equal(frame(shipped), here)


def test_carry_rows_are_the_hinted_policies_replayed_with_the_drafts_carry():
    """Draft scenarios of one sequence: lookahead / hinted_sweep once more with carry=drafts (variant carry), the
    fitted decay and the other fold's prior as in their main rows; no carry rows elsewhere."""
    from freetoken.experiments.policy_grid import BY_LABEL, options
    from freetoken.experiments.traces import stream_of
    from freetoken.placement.policies.sweep.layer_sweep import visit_rates

    case, trace = _case()
    rows = ps.run_case(case, Path("."), [0.25], ("lru", "lookahead", "hinted_sweep"), scenarios=ps.SCENARIOS)
    carried = {(r["scenario"], r["policy"]): r for r in rows if r["variant"] == "carry"}
    assert {s for s, _ in carried} == {sc.label for sc in ps.SCENARIOS if sc.draft_depth and sc.batch == 1}
    halves = [trace.select(np.isin(trace.request, g)) for g in ([0, 1], [2, 3])]
    sc = next(sc for sc in ps.SCENARIOS if sc.label == "draft 3 a=0.8")
    for label in ("lookahead", "hinted_sweep"):
        e = BY_LABEL[label]
        want = [0, 0]
        for h, o in zip(halves, halves[::-1]):
            opts = options(e, ps.fit_decay(o, 0.25, 16), visit_rates(stream_of(o, 16), 4, 8))
            for i, carry in enumerate([{}, {"carry": "drafts"}]):
                t = simulate(h, SimConfig(e.policy, Split("offload"), fraction=0.25, prefill_chunk=16,
                                          options={**opts, **carry}, **sc.sim_fields())).total
                want[i] += t.misses + t.prefetched
        main = next(r for r in rows if r["scenario"] == sc.label and r["policy"] == label and r["variant"] == "main")
        assert (main["transfers"], carried[(sc.label, label)]["transfers"]) == tuple(want)
        assert carried[(sc.label, label)]["params"].endswith("carry=drafts")
