"""`ft bench serve` end to end on the shipped demo model: its client process streams every requested token back
(n requests x max_tokens), and each row's ratios are the measured rates over the one-request row."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")


@pytest.mark.slow
def test_bench_serve_streams_every_token_and_reports_its_ratios():
    done = subprocess.run([sys.executable, "-m", "freetoken.cli", "bench", "serve", "--concurrency", "1,3",
                           "--max-tokens", "5", "--threads", "1", "--repeat", "1", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)["rows"]
    assert [(r["concurrency"], r["tokens"]) for r in rows] == [(1, 5), (3, 15)]
    one = rows[0]
    for r in rows:
        assert r["decode_tok_s"] > 0 and r["engine_decode_tok_s"] > 0
        assert r["vs_1"] == pytest.approx(r["decode_tok_s"] / one["decode_tok_s"])
        assert r["engine_vs_1"] == pytest.approx(r["engine_decode_tok_s"] / one["engine_decode_tok_s"])
