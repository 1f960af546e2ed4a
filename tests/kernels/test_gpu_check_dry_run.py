"""benchmarks/gpu_check_kernels.py: its case table builds and passes at tiny shapes under the interpreter."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import REPO


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check_kernels", REPO / "benchmarks" / "gpu_check_kernels.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_dry_run_checks_every_kernel(capsys):
    results = _module().check_kernels(dry_run=True)
    names = [r.name for r in results]
    for kernel in ("rms_norm", "apply_rope", "attention prefill", "attention decode", "attention prefill fp8 kv",
                   "attention decode fp8 kv", "router_topk", "linear",
                   "expert_ffn decode", "expert_ffn prefill", "expert_ffn_quant", "causal_conv1d prefill",
                   "causal_conv1d_update", "gated_delta_chunk", "gated_delta_step", "rms_norm_gated"):
        assert any(n.startswith(kernel) for n in names), kernel
    bad = [(r.name, r.rel_err) for r in results if not r.ok]
    assert not bad
    assert len(capsys.readouterr().out.splitlines()) == len(results) + 1


def test_inconsistent_shapes_are_refused():
    mod = _module()
    with pytest.raises(ValueError, match="inconsistent"):
        mod.KernelShapes(D=8, I=8, E=4, K=2, H=6, Hkv=4, Dh=8, slots=2, vocab=10, prefill_tokens=2, context=4)


def test_summary_json_fails_on_a_case_under_its_bandwidth_threshold(tmp_path):
    import json

    mod = _module()
    assert mod.passes(1e-3, 2e-2, 75.0, 70, 4000.0) and not mod.passes(1e-3, 2e-2, 50.0, 70, 4000.0)
    assert mod.passes(1e-3, 2e-2, 0.0, 70, 0.0)  # no device bandwidth measured (CPU): numbers only
    assert not mod.passes(0.1, 2e-2, 90.0, 70, 4000.0)

    def row(name, pct):
        return mod.KernelResult(name, 0.0, 1e-3, 0.01, 0.1, 40 * pct, mod.passes(1e-3, 2e-2, pct, 70, 4000.0),
                                hbm_pct=pct, graphed=True, min_hbm_pct=70, hbm_gbps=4000.0)

    fast, slow = row("linear fused qkv decode", 75.0), row("expert_ffn decode K slots", 50.0)
    assert mod.write_summary([fast], tmp_path / "ok.json")["verdict"] == "PASS"
    mod.write_summary([fast, slow], tmp_path / "out" / "k.json")
    summary = json.loads((tmp_path / "out" / "k.json").read_text())
    assert summary["verdict"] == "FAIL" and summary["failures"] == ["expert_ffn decode K slots"]
    assert summary["kernels"][1]["hbm_pct"] == 50.0 and summary["kernels"][0]["graphed"] is True


def test_an_interrupted_summary_write_leaves_the_last_summary_whole(tmp_path, monkeypatch):
    """Interrupted at the flush to disk (the step between writing and the rename): the old file as it was, and no
    temporary file left beside it."""
    from tests.interrupted_write import assert_interrupted_write_keeps_old

    mod = _module()
    path = tmp_path / "k.json"
    assert_interrupted_write_keeps_old(path, '{"verdict": "PASS"}', monkeypatch, lambda: mod.write_summary([], path))
