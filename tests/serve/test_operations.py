"""What an operator of `ft serve` sees: one access-log line per request (4xx at WARNING with the reason), the series
vLLM's dashboards read, HEAD /health, no home folder in /health, the served context and what set it, a warning on
an open host without a key, one line naming the [serve] extra when it is missing."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import TIMEOUT, openai_client


def samples(url: str) -> dict:
    text = httpx.get(url + "/metrics", timeout=TIMEOUT).text
    return {(s.name, s.labels.get("finished_reason") or s.labels.get("le")): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def access_lines(caplog, n: int) -> list[tuple[str, str]]:
    """The access log's (level, message) lines once there are n: a line is written after its response has been sent,
    so the client can read the reply before the server's `finally` logs it."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        lines = [(rec.levelname, rec.getMessage()) for rec in caplog.records if rec.name == "freetoken.access"]
        if len(lines) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.01)


def test_access_log_lines(served, model_id, caplog):
    client = openai_client(served.url)
    with caplog.at_level(logging.INFO, logger="freetoken.access"):
        r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        stream = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=2, stream=True)
        list(stream)
        bad = httpx.post(served.url + "/v1/chat/completions", json={"model": model_id, "messages": []},
                         timeout=TIMEOUT)
        lines = access_lines(caplog, 3)
    ok = [m for lvl, m in lines if " 200 " in m and "/v1/chat/completions" in m]
    assert ok[0].startswith("127.0.0.1 POST /v1/chat/completions 200 tokens ")
    assert f" tokens {r.usage.prompt_tokens}+{r.usage.completion_tokens} " in ok[0] and ok[0].endswith("ms")
    assert f" tokens {r.usage.prompt_tokens}+2 " in ok[1]  # the stream's line, written when it ended
    assert bad.status_code == 400
    assert lines[-1][0] == "WARNING" and lines[-1][1].startswith("127.0.0.1 POST /v1/chat/completions 400 ")
    assert lines[-1][1].endswith(": messages: List should have at least 1 item after validation, not 0")


def test_vllm_dashboard_series(served, model_id):
    client = openai_client(served.url)
    before = samples(served.url)
    r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "metrics"}],
                                       max_tokens=5, temperature=0)
    after = samples(served.url)
    for name in ("vllm:e2e_request_latency_seconds_count", "vllm:request_queue_time_seconds_count",
                 "vllm:request_prefill_time_seconds_count", "vllm:request_decode_time_seconds_count",
                 "vllm:time_to_first_token_seconds_count", "vllm:request_prompt_tokens_count"):
        assert after[(name, None)] == before.get((name, None), 0) + 1, name
    assert after[("vllm:request_generation_tokens_sum", None)] - before.get(
        ("vllm:request_generation_tokens_sum", None), 0) == r.usage.completion_tokens
    assert after[("vllm:prompt_tokens_total", None)] - before.get(("vllm:prompt_tokens_total", None), 0) == \
        r.usage.prompt_tokens
    assert after[("vllm:request_success_total", "length")] == before.get(("vllm:request_success_total", "length"),
                                                                         0) + 1
    assert 0 < after[("vllm:kv_cache_usage_perc", None)] <= 1  # the prefix cache holds the finished request's KV
    health = httpx.get(served.url + "/health", timeout=TIMEOUT).json()
    experts = health["engine"]["expert_cache"]
    assert after[("freetoken_expert_cache_hit_rate", None)] == pytest.approx(
        experts["hits"] / max(1, experts["hits"] + experts["misses"]), rel=0.05)
    assert ("freetoken_expert_cache_cpu_misses_total", None) in after


def test_head_health_and_no_home_folder(served):
    assert httpx.head(served.url + "/health", timeout=TIMEOUT).status_code == 200
    assert httpx.head(served.url + "/", timeout=TIMEOUT).status_code == 200
    text = httpx.get(served.url + "/health", timeout=TIMEOUT).text
    home = str(Path.home())
    assert home in ("", "/") or home + "/" not in text


def test_served_context_is_the_models_unless_flag_or_plan_says_less(tiny_model_dir):
    from freetoken.serve.config import ServeConfig
    from freetoken.serve.startup import context_line, load

    backend, plan = load(ServeConfig(model=tiny_model_dir, device_budget_gb=1.0, port=0), log=lambda s: None)
    assert backend.max_context == backend.model_context == 1024
    assert context_line(1024, 1024, None, plan.kv_tokens) == "context 1024 tokens (the model's own)"
    backend, _ = load(ServeConfig(model=tiny_model_dir, device_budget_gb=1.0, port=0, max_context=300),
                      log=lambda s: None)
    assert backend.max_context == 300
    with pytest.raises(ValueError, match="--max-context 4096 is more than this model's context of 1024 tokens"):
        load(ServeConfig(model=tiny_model_dir, device_budget_gb=1.0, port=0, max_context=4096), log=lambda s: None)
    lines = []
    backend, plan = load(ServeConfig(model=tiny_model_dir, device_budget_gb=0.0004, kv_floor=64, port=0),
                         log=lines.append)  # a budget whose KV cache holds fewer tokens than the model's context
    assert plan.kv_tokens < 1024 and backend.max_context == plan.kv_tokens
    assert f"context {plan.kv_tokens} tokens (the model's is 1024; limited by the memory plan's KV cache" in \
        "\n".join(lines)


def test_open_host_warning(capsys):
    from freetoken.cli.cmd_serve import warn_open_host
    from freetoken.serve.config import ServeConfig

    warn_open_host(ServeConfig(host="0.0.0.0"))
    assert "warning: listening on 0.0.0.0 without --api-key" in capsys.readouterr().err
    for cfg in (ServeConfig(host="0.0.0.0", api_key="k"), ServeConfig(host="127.0.0.1"), ServeConfig(host="::1")):
        warn_open_host(cfg)
        assert capsys.readouterr().err == ""


def test_missing_serve_extra_is_one_line(monkeypatch, capsys):
    import importlib.util

    from freetoken.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fastapi" else real(name, *a))
    assert main(["serve"]) != 0
    err = capsys.readouterr().err.strip()
    assert err == "ft serve: error: ft serve needs fastapi: pip install 'freetoken[serve]'"


def test_max_running_default_is_four():
    from freetoken.cli import build_parser
    from freetoken.cli.cmd_serve import config_from_args

    assert config_from_args(build_parser().parse_args(["serve"])).max_running == 4
