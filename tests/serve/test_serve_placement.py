"""ft serve --placement / --eager: the flags reach the engine, the start-up lines say where the policy decides and
how decode runs (the same lines ft generate prints), and bad combinations are one-line errors naming the flag."""

from __future__ import annotations

import pytest

# the demo model's decode on the host kernels (engine/host_decode.py)
HOST_DECODE = "decode: one host call per token (every layer's kernels in C; then each MoE call's placement and counts)"

HOST_LINE = "placement: lru decides on the host (compiled; its device form runs on CUDA or --placement device)"
DEVICE_LINE = "placement: lru decides on the device (one Triton program per MoE call, no host round trip)"


def _load(**kw):
    from freetoken.serve.config import ServeConfig
    from freetoken.serve.startup import load

    lines: list[str] = []
    backend, _ = load(ServeConfig(device_budget_gb=0.0009, kv_floor=512, **kw), log=lines.append)
    return backend.engine, lines


def test_host_placement_and_eager_reach_the_engine_and_the_startup_lines():
    engine, lines = _load(placement="host", eager=True)
    assert engine.cache.device_moe is None and engine.graphs is None
    assert lines[-2:] == [HOST_LINE, HOST_DECODE]


def test_device_placement_on_cpu_decides_on_the_device_and_says_why_decode_is_eager():
    engine, lines = _load(placement="device")
    assert engine.cache.device_moe is not None and engine.graphs is None  # no CUDA here: no graphs
    assert lines[-2:] == [DEVICE_LINE, "decode: eager (CUDA graphs need CUDA)"]
    engine, lines = _load(placement="device", eager=True)
    assert engine.cache.device_moe is not None
    assert lines[-1] == "decode: eager (--eager)"


def test_auto_placement_on_cpu_is_the_host_path():
    engine, lines = _load()
    assert engine.cache.device_moe is None and lines[-2] == HOST_LINE


@pytest.mark.parametrize("args, message", [
    (["--placement", "device", "--policy", "s3fifo"],
     "--placement device: policy s3fifo has no device form (device: lru, static_layers, frequency); "
     "use --placement auto or host"),
    (["--backend", "hf", "--eager"], "--placement / --eager do nothing for --backend hf (no expert cache)"),
    (["--backend", "hf", "--placement", "host"], "--placement / --eager do nothing for --backend hf (no expert cache)"),
    (["--kv-dtype", "fp4"], "--kv-dtype: 'fp4' is not one of auto, bf16, fp8"),
])
def test_bad_placement_flags_are_one_line_errors(args, message, capsys):
    from freetoken.cli import main

    assert main(["serve", *args]) == 2
    assert capsys.readouterr().err == f"ft serve: error: {message}\n"


def test_config_refuses_an_unknown_placement():
    from freetoken.serve.config import ServeConfig

    with pytest.raises(ValueError, match=r"^--placement 'gpu' is not one of auto, device, host$"):
        ServeConfig(placement="gpu")


def test_device_placement_serves_what_the_host_placement_serves():
    """The served engine with --placement device (Triton's interpreter here) = the host decision: the same tokens
    and the same hits / misses on a cache of a quarter of the experts."""
    from freetoken.engine import SamplingParams

    runs = {}
    for placement in ("host", "device"):
        engine, _ = _load(placement=placement, capacity=4)
        tokens = list(engine.generate([3, 4, 5, 6, 7, 8, 9], SamplingParams(greedy=True), max_tokens=6))
        runs[placement] = (tokens, engine.counters.hits, engine.counters.misses)
    assert runs["device"] == runs["host"]
    assert runs["host"][2] > 0  # misses happened: the decisions were exercised


@pytest.mark.parametrize("asked, decides_on, decode", [
    ("auto", "host", HOST_DECODE),  # auto without CUDA: the host
    ("host", "host", HOST_DECODE),
    ("device", "device", "decode: eager (CUDA graphs need CUDA)"),
])
def test_health_reports_the_placement(asked, decides_on, decode):
    """/health says where the policy decides, which policy, what --placement asked, and the start-up lines; the
    engine behind it agrees (its device decision exists exactly when /health says device)."""
    import httpx

    from conftest import TIMEOUT, running

    with running(None, placement=asked, device_budget_gb=0.0009, kv_floor=512) as served:
        health = httpx.get(served.url + "/health", timeout=TIMEOUT).json()
        engine = served.service.backend.engine
    line = {"host": HOST_LINE, "device": DEVICE_LINE}[decides_on]
    assert health["engine"]["placement"] == {"policy": "lru", "decides_on": decides_on, "asked": asked,
                                             "line": line, "decode": decode}
    assert (engine.cache.device_moe is not None) == (decides_on == "device")
