"""Start-up cost of `ft`: building the parser imports no heavy module, and the trace / simulator commands run
without torch. Each check runs in a fresh interpreter, since this test process has imported everything."""

from __future__ import annotations

import pytest

import json
import subprocess
import sys

from freetoken.paths import REPO_ROOT as REPO
from freetoken.paths import DEFAULT_TRACE

HEAVY = ("torch", "numba", "numpy", "rich", "triton", "transformers")


def _run(script: str) -> dict:
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_building_the_parser_and_ft_help_import_nothing_heavy():
    got = _run(f"""
import contextlib, io, json, sys
from freetoken.cli import build_parser, main
build_parser()
with contextlib.redirect_stdout(io.StringIO()) as help_text:
    try:
        main(["--help"])
    except SystemExit as e:
        code = e.code
print(json.dumps({{"code": code, "help": help_text.getvalue(), "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
""")
    assert got["code"] == 0
    assert "sim" in got["help"] and "trace" in got["help"]
    assert got["heavy"] == []


@pytest.mark.slow
def test_sim_trace_and_bench_sim_run_without_torch(tmp_path, shared_traces):
    log = shared_traces / "mixtral-8x7b" / "humaneval_1_routing.jsonl"
    imported, synth = tmp_path / "h1.safetensors", tmp_path / "synth.safetensors"
    commands = [
        ["sim", "--trace", str(DEFAULT_TRACE), "--policy", "lru", "--capacity", "16", "--json"],
        ["trace", "import", str(log), str(imported)],
        ["trace", "info", str(imported), "--json"],
        ["trace", "synth", str(synth), "--layers", "2", "--experts", "4", "--top-k", "2", "--tokens", "16"],
        ["bench", "sim", "--trace", str(imported), "--capacities", "2", "--repeat", "1", "--no-per-request",
         "--policies", "lru", "--json"],
    ]
    got = _run(f"""
import contextlib, io, json, sys
from freetoken.cli import main
codes = []
for argv in {commands!r}:
    with contextlib.redirect_stdout(io.StringIO()):
        codes.append(main(argv))
print(json.dumps({{"codes": codes, "torch": "torch" in sys.modules}}))
""")
    assert got["codes"] == [0] * len(commands)
    assert imported.is_file() and synth.is_file()
    assert got["torch"] is False
