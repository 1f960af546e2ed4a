"""`ft serve` as a user runs it: a subprocess on a free port prints the memory plan and a `ready` line with the
address; `ft launch` then finds the served model id by asking it."""

from __future__ import annotations

import pytest

import os
import re
import selectors
import signal
import subprocess
import sys
import time

import httpx

from conftest import TIMEOUT

FT = [os.path.join(os.path.dirname(sys.executable), "ft")]  # the installed console script


def read_until_ready(proc: subprocess.Popen, seconds: float = 90.0) -> tuple[str, list[str]]:
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    lines, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not sel.select(timeout=0.5):
            if proc.poll() is not None:
                break
            continue
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        m = re.fullmatch(r"ready (http://127\.0\.0\.1:\d+)", lines[-1])
        if m:
            return m.group(1), lines
    raise AssertionError("no ready line:\n" + "\n".join(lines))


@pytest.mark.slow
def test_ft_serve_prints_plan_and_ready_then_launch_finds_the_model(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*FT, "serve", "--port", "0", "--device-budget", "0.5"],  # the demo model
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        url, lines = read_until_ready(proc)
        text = "\n".join(lines)
        assert "memory plan (cpu (--device-budget), budget 0.50 GiB)" in text
        assert re.search(r"KV cache .* tokens \(floor 2048\)", text)  # the demo's whole context
        health = httpx.get(url + "/health", timeout=TIMEOUT).json()
        assert health["model"] == "freetoken-demo" and health["engine"]["backend"] == "engine"
        port = url.rsplit(":", 1)[1]
        out = subprocess.run([*FT, "launch", "claude", "--dry-run", "--port", port,
                              "--home", str(tmp_path)], capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        assert '"ANTHROPIC_MODEL": "freetoken-demo"' in out.stdout
        assert f'"ANTHROPIC_BASE_URL": "http://127.0.0.1:{port}"' in out.stdout
        assert not (tmp_path / ".claude").exists()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def test_ft_serve_bad_arguments_are_one_line_errors(tmp_path, tiny_model_dir, capsys):
    from freetoken.cli import main

    def run(*args):
        code = main(["serve", *args])
        return code, capsys.readouterr().err

    code, err = run("--model", str(tmp_path / "missing"))
    assert code == 2 and err == f"ft serve: error: --model {tmp_path / 'missing'}: not a directory\n"
    code, err = run("--max-running", "0", "--model", str(tmp_path))
    assert code == 2 and "--max-running must be >= 1" in err
    # 100000 tokens x 256 bytes of KV (2 layers x K,V x 2 heads x 8 dims x fp32) = 24.4 MiB > the 1 MiB budget
    code, err = run("--model", str(tiny_model_dir), "--device-budget", "0.001", "--kv-floor", "100000", "--port", "0")
    assert code == 2 and "KV floor of 100000 tokens (24.41 MiB)" in err and "lower --kv-floor" in err
    assert "Traceback" not in err
    for flag, value, words in (("--device-budget", "nan", " of GiB"), ("--device-budget", "inf", " of GiB"),
                               ("--max-body-mb", "nan", "")):  # nan was 'cannot convert float NaN to integer'
        code, err = run("--model", str(tiny_model_dir), flag, value)
        assert (code, err) == (2, f"ft serve: error: {flag} must be a positive, finite number{words}, got {value}\n")
