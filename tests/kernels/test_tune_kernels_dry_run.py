"""benchmarks/tune_kernels.py: its dry run (tiny shapes, interpreter, two candidates) measures, keeps a correct
candidate per shape class and writes it under the device's name, keeping the rest of the file."""

from __future__ import annotations

import pytest

import importlib.util
import json
import sys

from freetoken.kernels.tuning import CONFIG_FILE, load_table
from tests.conftest import REPO


def _module():
    spec = importlib.util.spec_from_file_location("tune_kernels", REPO / "benchmarks" / "tune_kernels.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_dry_run_writes_the_winners_for_this_device(tmp_path):
    import torch

    mod = _module()
    out = tmp_path / "tuned.json"
    best = mod.tune("cpu", torch.float32, out, quick=True, dry=True)
    table = load_table(out)
    assert table["default"] == json.loads(CONFIG_FILE.read_text())["default"]  # the defaults kept
    entry = table["devices"]["interpreter"]
    assert entry == best
    linear_candidates = mod.dry_grid(mod.linear_grid(True))
    assert entry["linear_decode"]["narrow"] in linear_candidates and entry["linear_decode"]["wide"] in linear_candidates
    assert entry["expert_ffn_decode"]["any"] in mod.dry_grid(mod.ffn_grid(True))
    assert entry["expert_ffn_quant_decode"]["any"] == entry["expert_ffn_decode"]["any"]


def test_dry_run_refuses_to_write_the_package_file(capsys):
    assert _module().main(["--dry-run"]) == 2
    assert "--out" in capsys.readouterr().err


def test_an_interrupted_write_leaves_the_table_whole(tmp_path, monkeypatch):
    """The table holds every device's tuned configs: interrupted at the flush to disk, it stays as it was (no
    temporary file beside it); written, it gains this device and keeps the others."""
    from tests.interrupted_write import assert_interrupted_write_keeps_old

    mod = _module()
    path = tmp_path / "tuned.json"
    old = json.dumps({"default": {}, "devices": {"gpu a": {"linear_decode": {"narrow": {"BLOCK_N": 8}}}}})
    assert_interrupted_write_keeps_old(path, old, monkeypatch, lambda: mod.write_table(
        path, "gpu b", {"linear_decode": {"narrow": {"BLOCK_N": 16}}}))
    monkeypatch.undo()
    mod.write_table(path, "gpu b", {"linear_decode": {"narrow": {"BLOCK_N": 16}}})
    assert json.loads(path.read_text())["devices"] == {"gpu a": {"linear_decode": {"narrow": {"BLOCK_N": 8}}},
                                                       "gpu b": {"linear_decode": {"narrow": {"BLOCK_N": 16}}}}
