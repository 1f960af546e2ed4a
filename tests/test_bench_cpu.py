"""ft bench cpu on the demo checkpoint: both sides run, report their rates, and agree on the greedy tokens (the
engine's CPU path against HF transformers in separate processes)."""

from __future__ import annotations

import pytest

import json

from freetoken.cli import main
from freetoken.paths import DEMO_MODEL


@pytest.mark.slow
def test_bench_cpu_runs_both_sides_and_they_agree(capsys):
    assert main(["bench", "cpu", "--model", str(DEMO_MODEL), "--prompt-tokens", "12", "--decode-tokens", "3",
                 "--reps", "1", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["same_tokens"] is True
    for side in ("engine", "hf"):
        assert row[f"{side}_prefill_tok_s"] > 0 and row[f"{side}_decode_tok_s"] > 0
        assert row[f"{side}_peak_rss_mib"] > 50  # a real process that loaded torch and the model
    assert row["decode_vs_hf"] == row["engine_decode_tok_s"] / row["hf_decode_tok_s"]


def test_bench_cpu_refuses_bad_sizes(capsys):
    assert main(["bench", "cpu", "--prompt-tokens", "0"]) == 2
    assert "--prompt-tokens" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_cpu_names_the_checkpoint_its_worker_could_not_load(capsys, tmp_path):
    assert main(["bench", "cpu", "--model", str(tmp_path / "none"), "--reps", "1"]) == 2
    # was: "bench cpu: the engine run failed: ['ft bench: error: ...']"
    assert capsys.readouterr().err == (f"ft bench: error: the engine run failed: {tmp_path / 'none'}: no such "
                                       f"checkpoint directory\n")
