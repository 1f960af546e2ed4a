"""Hostile or big input and the serving basics around it: a 50 MB body gets a 413 within 2 s while /health keeps
answering, a chunked one too; 100k-deep JSON is a 400; /health answers within 1 s while a request generates; the
API key in both APIs' error shapes; /metrics parses with prometheus_client's own parser and counts what was served."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import TIMEOUT, anthropic_client, openai_client

KEY = "sk-test-0123"


def health_times(url: str, stop: threading.Event, out: list) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        r = httpx.get(url + "/health", timeout=5)
        out.append((r.status_code, time.perf_counter() - t0, t0))
        time.sleep(0.01)


def while_probing_health(url: str, work):
    """work() with /health polled meanwhile; -> (work's result, [(status, seconds, started inside work())] of the
    probes: a fast machine finishes work() in a fraction of a second, and probes outside it prove nothing)."""
    stop, probes = threading.Event(), []
    thread = threading.Thread(target=health_times, args=(url, stop, probes))
    thread.start()
    try:
        time.sleep(0.05)
        start = time.perf_counter()
        result = work()
        end = time.perf_counter()
    finally:
        stop.set()
        thread.join(10)
    return result, [(status, took, start <= t0 and t0 + took <= end) for status, took, t0 in probes]


def test_a_50_mb_body_is_refused_quickly_while_health_answers(served, model_id):
    url = served[0]
    body = b'{"model": "' + model_id.encode() + b'", "messages": [{"role": "user", "content": "' + \
        b"a" * (50 * 2**20) + b'"}]}'

    def post():
        t0 = time.perf_counter()
        r = httpx.post(url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"},
                       timeout=TIMEOUT)
        return r, time.perf_counter() - t0

    (r, took), probes = while_probing_health(url, post)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large" and took < 2.0
    assert probes and all(status == 200 and s < 1.0 for status, s, _ in probes)

    def chunks():  # no content-length: counted as it streams in
        for _ in range(50):
            yield b"a" * 2**20

    r = httpx.post(url + "/v1/messages", content=chunks(), headers={"content-type": "application/json"},
                   timeout=TIMEOUT)
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"


def test_deep_json_is_a_400(served):
    for body in ("[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000,
                 '{"model": "x", "messages": ' + "[" * 500 + "]" * 500 + "}"):
        r = httpx.post(served[0] + "/v1/chat/completions", content=body, timeout=TIMEOUT,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400 and "nests deeper" in r.json()["error"]["message"], r.text[:200]


def test_health_answers_while_a_request_generates(served, model_id):
    client = openai_client(served[0])
    probes = []
    for _ in range(10):  # until three probes fell inside a generation, however fast this machine generates
        r, inside = while_probing_health(served[0], lambda: client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "go on"}], max_tokens=200, temperature=0,
            logit_bias={"5": 100}))  # a token that is no stop token: all 200 steps run
        assert r.usage.completion_tokens == 200
        probes += [(status, took) for status, took, during in inside if during]
        if len(probes) >= 3:
            break
    assert len(probes) >= 3, probes
    assert all(status == 200 and s < 1.0 for status, s in probes)


@pytest.fixture(scope="module")
def keyed(tiny_served):
    """A second app with a key over the tiny model's service."""
    from freetoken.serve.app import build_app
    from freetoken.serve.config import ServeConfig
    from freetoken.serve.server import Server

    service = tiny_served[1]
    server = Server(build_app(service, ServeConfig(api_key=KEY)), "127.0.0.1", 0, announce=False)
    thread = server.start_in_thread()
    yield server.url, service.backend.model_id
    server.stop(thread)


def test_api_key_in_both_apis(keyed):
    import anthropic
    import openai

    url, model = keyed
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError) as e:
        openai_client(url, api_key="wrong").models.list()
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    r = httpx.post(url + "/v1/chat/completions", json={"model": model, "messages": msgs}, timeout=TIMEOUT)
    assert r.status_code == 401 and "missing API key" in r.json()["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic_client(url, api_key="wrong").messages.create(
            model=model, max_tokens=2, messages=msgs)
    assert e.value.status_code == 401 and e.value.body["error"]["type"] == "authentication_error"
    for path in ("/health", "/metrics", "/version"):  # vLLM's rule: the key guards /v1/... only
        assert httpx.get(url + path, timeout=TIMEOUT).status_code == 200
    assert httpx.head(url + "/health", timeout=TIMEOUT).status_code == 200
    ok = openai_client(url, api_key=KEY)
    assert ok.chat.completions.create(model=model, messages=msgs, max_tokens=2).usage.completion_tokens >= 1
    m = anthropic_client(url, api_key=KEY).messages.create(
        model=model, max_tokens=2, messages=msgs)  # the SDK sends x-api-key
    assert m.usage.output_tokens >= 1


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=TIMEOUT).text
    return {(s.name + "".join(f"|{v}" for v in s.labels.values())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics_count_what_was_served(tiny_served):
    url, service = tiny_served
    client = openai_client(url)
    before = metrics(url)
    usages = [client.chat.completions.create(model=service.backend.model_id, max_tokens=n, temperature=0,
                                             messages=[{"role": "user", "content": f"count {n}"}]).usage
              for n in (3, 5)]
    after = metrics(url)
    delta = lambda name: after.get(name, 0) - before.get(name, 0)  # noqa: E731
    finished = sum(v for k, v in after.items() if k.startswith("freetoken_requests_total|")) - \
        sum(v for k, v in before.items() if k.startswith("freetoken_requests_total|"))
    assert finished == 2
    assert delta("freetoken_generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert delta("freetoken_prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta("freetoken_time_to_first_token_seconds_count") == 2
    assert delta("freetoken_inter_token_latency_seconds_count") == sum(u.completion_tokens - 1 for u in usages)
    assert delta("freetoken_decode_batch_size_count") == sum(u.completion_tokens - 1 for u in usages)
    health = httpx.get(url + "/health", timeout=TIMEOUT).json()
    assert after["freetoken_requests_running"] == 0 and after["freetoken_requests_waiting"] == 0
    cache = health["engine"]["expert_cache"]
    assert metrics(url)["freetoken_expert_cache_hits_total"] == cache["hits"] > 0
    assert after["freetoken_prefix_cache_reused_tokens_total"] <= health["engine"]["prefix_cache"]["reused_tokens"]


def test_model_by_id_and_version(served, model_id):
    import openai

    client = openai_client(served[0])
    assert client.models.retrieve(model_id).id == model_id
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    v = httpx.get(served[0] + "/version", timeout=TIMEOUT).json()
    assert v["model"] == model_id and v["backend"] == "engine" and v["version"]
