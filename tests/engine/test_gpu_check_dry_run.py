"""benchmarks/gpu_check.py --dry-run: the device check's own code on a tiny shape on CPU."""

from __future__ import annotations

import pytest

import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.slow
def test_gpu_check_dry_run(capsys):
    sys.path.insert(0, str(BENCH))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(BENCH))
    rows = gpu_check.run_check(dry_run=True, kernels="reference", tokens=4, prompt=5, check_kernel_suite=False)
    out = capsys.readouterr().out
    assert [(r["policy"], r["split"]) for r in rows] == list(gpu_check.CONFIGS)
    by = {(r["policy"], r["split"]): r for r in rows}
    tiny = gpu_check.TINY
    assert all(r["tokens"] == 4 and r["capacity"] == round(0.37 * tiny.layers * tiny.experts) for r in rows)
    # 6 slots < one layer's 8 experts: static_layers keeps every layer on the CPU, so nothing ever hits
    assert by[("static_layers", "cpu")]["decode_hits"] == 0
    # decode accesses: 3 decode steps (4 tokens, the first from prefill) x 2 layers x top-2
    assert all(r["decode_accesses"] == 3 * tiny.layers * tiny.top_k for r in rows)
    assert by[("frequency", "cpu")]["decode_hits"] > 0  # pins the experts the first run used most
    assert "lru" in out and "tok/s" in out
    assert all(r["kernels_per_layer"] is None for r in rows)  # counted for the Triton kernels only


@pytest.mark.slow
def test_gpu_check_verdict_exit_code_and_json(tmp_path, capsys, monkeypatch):
    """Within the stated tolerance: PASS, exit 0, JSON summary; a tolerance nothing can meet: FAIL, exit 1."""
    import json

    sys.path.insert(0, str(BENCH))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(BENCH))
    argv = ["--dry-run", "--kernels", "reference", "--tokens", "3", "--prompt", "4", "--skip-kernel-check"]
    assert gpu_check.main(argv + ["--json", str(tmp_path / "ok.json")]) == 0
    ok = json.loads((tmp_path / "ok.json").read_text())
    assert ok["verdict"] == "PASS" and ok["failures"] == [] and len(ok["configs"]) == len(gpu_check.CONFIGS)
    assert all(r["argmax_agreement"] == 1.0 and r["max_abs_delta"] <= 1e-4 * r["scale"] for r in ok["configs"])
    assert ok["versions"]["torch"] == torch.__version__
    assert ok["baseline"]["tok_s"] > 0 and ok["baseline"]["capacity"] == gpu_check.TINY.layers * gpu_check.TINY.experts
    twin = ok["graph_vs_eager"]  # on CPU both runs are eager: the same arithmetic
    assert twin["eager_tok_s"] > 0 and twin["graph_tok_s"] > 0 and twin["argmax_agreement"] == 1.0
    assert twin["max_abs_delta"] <= 1e-4 * twin["scale"] and twin["eager_decode_mode"].startswith("decode: eager")
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    monkeypatch.setitem(gpu_check.TOLERANCE, "float32", (-1.0, 1.0))  # a negative bound: every config fails
    assert gpu_check.main(argv) == 1
    bad = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert bad["verdict"] == "FAIL" and len(bad["failures"]) == len(gpu_check.CONFIGS)
    assert capsys.readouterr().out.rstrip().splitlines()[-len(gpu_check.CONFIGS) - 1] == "FAIL:"


def test_an_interrupted_summary_write_leaves_the_last_summary_whole(tmp_path, monkeypatch):
    """Interrupted at the flush to disk: the last run's gpu_check.json as it was, no temporary file beside it."""
    from tests.interrupted_write import assert_interrupted_write_keeps_old

    sys.path.insert(0, str(BENCH))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(BENCH))
    monkeypatch.setattr(gpu_check, "run_check", lambda *a: [])  # the summary write alone
    path = tmp_path / "gpu_check.json"
    assert_interrupted_write_keeps_old(path, '{"verdict": "PASS"}', monkeypatch,
                                       lambda: gpu_check.main(["--dry-run", "--json", str(path)]))
