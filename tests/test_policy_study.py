"""experiments.policy_study on a tiny synthetic case: the rows are the replays they claim to be, the fit sees only
the profile, and bad arguments fail in one line."""

from pathlib import Path

import numpy as np
import pytest

from experiments import policy_study as ps
from freetoken.placement import Split
from freetoken.trace.stats import expert_counts
from sim.run import SimConfig, simulate
from sim.synth import SynthSpec, synthesize


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
