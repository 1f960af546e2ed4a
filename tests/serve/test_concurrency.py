"""Concurrent clients all get their own right answers; a client that disconnects mid-stream frees its slot;
a full queue answers 503 in the API's error shape."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from conftest import TIMEOUT, openai_client, running, start_server


def test_concurrent_clients_get_correct_answers(served, model_id, greedy):
    prompts = [f"question number {i}" for i in range(5)]
    expect = [greedy(p, 5).text for p in prompts]
    client = openai_client(served[0])

    def ask(i):
        if i % 2:  # half of them stream
            chunks = client.chat.completions.create(model=model_id, max_tokens=5, temperature=0, stream=True,
                                                    messages=[{"role": "user", "content": prompts[i]}])
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        r = client.chat.completions.create(model=model_id, max_tokens=5, temperature=0,
                                           messages=[{"role": "user", "content": prompts[i]}])
        return r.choices[0].message.content

    with ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(ask, range(len(prompts))))  # 5 clients, 2 running, 3 queued
    assert got == expect
    health = httpx.get(served[0] + "/health", timeout=TIMEOUT).json()
    assert (health["running"], health["waiting"]) == (0, 0)


@pytest.fixture(scope="module")
def one_slot():
    """A server with one running request and no queue: a leaked slot shows as a 503 or a hang."""
    server, thread, service = start_server(None, max_running=1, max_waiting=0)
    yield server.url, service
    server.stop(thread)
    service.shutdown()


def wait_idle(url: str, seconds: float = 20.0) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        health = httpx.get(url + "/health", timeout=TIMEOUT).json()
        if health["running"] == 0 or time.monotonic() > deadline:
            return health
        time.sleep(0.05)


def test_disconnect_mid_stream_frees_the_slot(one_slot, model_id):
    url, service = one_slot
    decoded_before = service.backend.engine.stats.decode_tokens
    body = {"model": model_id, "max_tokens": 1500, "stream": True, "temperature": 0,
            "messages": [{"role": "user", "content": "a long answer please"}]}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=TIMEOUT) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")  # the stream is running ...
        busy = httpx.post(url + "/v1/chat/completions", timeout=TIMEOUT, json={**body, "stream": False})
        assert busy.status_code == 503 and "busy" in busy.json()["error"]["message"]
        busy = httpx.post(url + "/v1/messages", timeout=TIMEOUT, json={**body, "stream": False})
        assert busy.status_code == 503 and busy.json()["error"]["type"] == "overloaded_error"
    # ... and the client has gone: the slot comes back long before 1500 tokens could have been generated
    health = wait_idle(url)
    assert health["running"] == 0 and health["cancelled"] == 1
    assert service.backend.engine.stats.decode_tokens - decoded_before < 1000  # the engine stopped, too
    r = httpx.post(url + "/v1/chat/completions", timeout=TIMEOUT,
                   json={**body, "stream": False, "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_four_concurrent_requests_decode_together_and_equal_their_solo_runs(greedy):
    """Continuous batching: 4 requests in flight decode in shared steps (the batch-size histogram shows batches
    > 1), and each answer equals `ft generate` on its prompt alone."""
    from prometheus_client.parser import text_string_to_metric_families

    prompts = [f"tell me about expert {i}" for i in range(4)]
    expect = [greedy(p, 24) for p in prompts]
    with running(None, max_running=4) as (url, service):
        client = openai_client(url)

        def ask(p):
            r = client.chat.completions.create(model=service.backend.model_id, max_tokens=24, temperature=0,
                                               messages=[{"role": "user", "content": p}])
            return r.choices[0].message.content, r.usage.completion_tokens

        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(ask, prompts))
        samples = {(s.name, s.labels.get("le")): s.value for fam in text_string_to_metric_families(
            httpx.get(url + "/metrics", timeout=TIMEOUT).text) for s in fam.samples}
    assert got == [(g.text, len(g.out)) for g in expect]
    steps = samples[("freetoken_decode_batch_size_count", None)]
    single = samples[("freetoken_decode_batch_size_bucket", "1.0")]
    assert steps - single > 0  # decode steps of more than one sequence
    decoded = sum(n - 1 for _, n in got)  # every decode step's sequences add up to the decoded tokens
    assert samples[("freetoken_decode_batch_size_sum", None)] == decoded and steps < decoded
