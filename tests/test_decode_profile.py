"""benchmarks/decode_profile.py --dry-run: its code on the tiny shape on CPU (no GPU time to read there)."""

from __future__ import annotations

import json
import sys

from tests.conftest import REPO


def _main():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import decode_profile
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return decode_profile.main


def test_dry_run_profiles_each_fraction(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert _main()(["--dry-run", "--tokens", "2", "--fractions", "1.0,0.5", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["capacity"] for r in rows] == [16, 8]  # TINY: 2 layers x 8 experts, all and half
    assert all(r["wall_ms_per_token"] > 0 and r["gpu_ms_per_token"] == 0 for r in rows)  # CPU: no device events
    assert "fraction 0.5 (8 slots, offload)" in capsys.readouterr().out


def test_bad_fractions_name_the_flag(capsys):
    assert _main()(["--dry-run", "--fractions", "half"]) == 2
    assert "--fractions 'half'" in capsys.readouterr().err
