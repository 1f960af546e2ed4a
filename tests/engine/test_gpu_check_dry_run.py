"""benchmarks/gpu_check.py --dry-run: the device check's own code on a tiny shape on CPU."""

from __future__ import annotations

import pytest

import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _gpu_check():
    sys.path.insert(0, str(BENCH))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(BENCH))
    return gpu_check


@pytest.mark.slow
def test_gpu_check_dry_run_verdict_exit_code_and_json(tmp_path, capsys, monkeypatch):
    """The device check's own code on the tiny shape: every configuration's counts as derived by hand; within the
    stated tolerance PASS, exit 0, a JSON summary; a tolerance nothing can meet: FAIL, exit 1 (that run over one
    configuration: the verdict's code is the same for each)."""
    import json

    gpu_check = _gpu_check()
    argv = ["--dry-run", "--kernels", "reference", "--tokens", "4", "--prompt", "5", "--skip-kernel-check"]
    assert gpu_check.main(argv + ["--json", str(tmp_path / "ok.json")]) == 0
    out = capsys.readouterr().out
    assert "lru" in out and "tok/s" in out and out.rstrip().endswith("PASS")
    ok = json.loads((tmp_path / "ok.json").read_text())
    rows = ok["configs"]
    assert ok["verdict"] == "PASS" and ok["failures"] == []
    assert [(r["policy"], r["split"]) for r in rows] == list(gpu_check.CONFIGS)
    assert all(r["argmax_agreement"] == 1.0 and r["max_abs_delta"] <= 1e-4 * r["scale"] for r in rows)
    by = {(r["policy"], r["split"]): r for r in rows}
    tiny = gpu_check.TINY
    assert all(r["tokens"] == 4 and r["capacity"] == round(0.37 * tiny.layers * tiny.experts) for r in rows)
    # 6 slots < one layer's 8 experts: static_layers keeps every layer on the CPU, so nothing ever hits
    assert by[("static_layers", "cpu")]["decode_hits"] == 0
    # decode accesses: 3 decode steps (4 tokens, the first from prefill) x 2 layers x top-2
    assert all(r["decode_accesses"] == 3 * tiny.layers * tiny.top_k for r in rows)
    assert by[("frequency", "cpu")]["decode_hits"] > 0  # pins the experts the first run used most
    assert all(r["kernels_per_layer"] is None for r in rows)  # counted for the Triton kernels only
    assert ok["versions"]["torch"] == torch.__version__
    assert ok["baseline"]["tok_s"] > 0 and ok["baseline"]["capacity"] == tiny.layers * tiny.experts
    twin = ok["graph_vs_eager"]  # on CPU both runs are eager: the same arithmetic
    assert twin["eager_tok_s"] > 0 and twin["graph_tok_s"] > 0 and twin["argmax_agreement"] == 1.0
    assert twin["max_abs_delta"] <= 1e-4 * twin["scale"] and twin["eager_decode_mode"].startswith("decode: eager")
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    monkeypatch.setitem(gpu_check.TOLERANCE, "float32", (-1.0, 1.0))  # a negative bound: every config fails
    monkeypatch.setattr(gpu_check, "CONFIGS", gpu_check.CONFIGS[1:2])
    monkeypatch.setattr(gpu_check, "quant_memory_check", lambda *a: [])  # (ran above; no part of the verdict)
    assert gpu_check.main(argv) == 1
    bad = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert bad["verdict"] == "FAIL" and len(bad["failures"]) == 1 and "lru+hybrid" in bad["failures"][0]
    assert capsys.readouterr().out.rstrip().splitlines()[-2:] == ["FAIL:", "  " + bad["failures"][0]]


def test_an_interrupted_summary_write_leaves_the_last_summary_whole(tmp_path, monkeypatch):
    """Interrupted at the flush to disk: the last run's gpu_check.json as it was, no temporary file beside it."""
    from tests.interrupted_write import assert_interrupted_write_keeps_old

    gpu_check = _gpu_check()
    monkeypatch.setattr(gpu_check, "run_check", lambda *a: [])  # the summary write alone
    path = tmp_path / "gpu_check.json"
    assert_interrupted_write_keeps_old(path, '{"verdict": "PASS"}', monkeypatch,
                                       lambda: gpu_check.main(["--dry-run", "--json", str(path)]))
