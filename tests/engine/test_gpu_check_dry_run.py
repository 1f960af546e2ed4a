"""benchmarks/gpu_check.py --dry-run: the device check's own code on a tiny shape on CPU."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


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
