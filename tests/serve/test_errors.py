"""Bad requests get a 4xx in the API's own error shape, and the server keeps serving after every one of them."""

from __future__ import annotations

import httpx
import pytest

from conftest import LONG, TIMEOUT, anthropic_client, openai_client


def openai_cases(model):
    msgs = [{"role": "user", "content": "hi"}]
    return [  # (body, status, param or code it must name)
        ("{not json", 400, None),
        ("[1, 2]", 400, None),
        ({"model": "no-such-model", "messages": msgs}, 404, "model"),
        ({"model": model, "messages": msgs, "max_tokens": -3}, 400, "max_tokens"),
        ({"model": model, "messages": msgs, "max_tokens": "many"}, 400, "max_tokens"),
        ({"model": model, "messages": "hi"}, 400, "messages"),
        ({"model": model, "messages": []}, 400, "messages"),
        ({"model": model}, 400, "messages"),
        ({"model": model, "messages": msgs, "temperature": "hot"}, 400, "temperature"),
        ({"model": model, "messages": msgs, "top_p": 0}, 400, "top_p"),
        ({"model": model, "messages": msgs, "n": 2}, 400, "n"),
        ({"model": model, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
        ({"model": model, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
         "messages.0.content"),
        ({"model": model, "messages": [{"role": "user", "content": LONG}]}, 400, "context_length_exceeded"),
        ({"model": model, "messages": [{"role": "user", "content": LONG}], "stream": True}, 400,
         "context_length_exceeded"),
    ]


def anthropic_cases(model):
    msgs = [{"role": "user", "content": "hi"}]
    return [
        ("{not json", 400, "invalid_request_error"),
        ({"model": "no-such-model", "max_tokens": 4, "messages": msgs}, 404, "not_found_error"),
        ({"model": model, "max_tokens": -1, "messages": msgs}, 400, "invalid_request_error"),
        ({"model": model, "messages": msgs}, 400, "invalid_request_error"),  # max_tokens is required
        ({"model": model, "max_tokens": 4, "messages": [{"role": "system", "content": "hi"}]}, 400,
         "invalid_request_error"),
        ({"model": model, "max_tokens": 4, "messages": msgs, "temperature": 3}, 400, "invalid_request_error"),
        ({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": LONG}], "stream": True}, 400,
         "invalid_request_error"),
    ]


def post(url, body):
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else {
        "json": body}
    return httpx.post(url, timeout=TIMEOUT, **kw)


def test_openai_errors_then_a_good_request(served, model_id):
    url = served[0]
    for body, status, name in openai_cases(model_id):
        r = post(url + "/v1/chat/completions", body)
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
        assert err["type"] == "invalid_request_error"
        if name is not None:
            assert name in (err["param"], err["code"]), (body, err)
    r = post(url + "/v1/responses", {"model": model_id, "input": [{"type": "image", "url": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input.0.type"
    r = httpx.get(url + "/v1/nowhere", timeout=TIMEOUT)
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(url + "/v1/chat/completions", timeout=TIMEOUT)
    assert r.status_code == 405 and "error" in r.json()
    good = post(url + "/v1/chat/completions", {"model": model_id, "max_tokens": 2,
                                               "messages": [{"role": "user", "content": "hi"}]})
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] >= 1


def test_anthropic_errors_then_a_good_request(served, model_id):
    url = served[0]
    for body, status, kind in anthropic_cases(model_id):
        r = post(url + "/v1/messages", body)
        assert r.status_code == status, (body, r.text)
        got = r.json()
        assert got["type"] == "error" and got["error"]["type"] == kind and got["error"]["message"]
    counted = post(url + "/v1/messages/count_tokens", {"model": model_id, "messages": [{"role": "user",
                                                                                       "content": LONG}]})
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 2048  # counting is not generating
    good = post(url + "/v1/messages", {"model": model_id, "max_tokens": 2,
                                       "messages": [{"role": "user", "content": "hi"}]})
    assert good.status_code == 200 and good.json()["type"] == "message"
    health = httpx.get(url + "/health", timeout=TIMEOUT).json()
    assert health["status"] == "ok" and health["running"] == 0 and health["waiting"] == 0


@pytest.mark.parametrize("client_kind", ["openai", "anthropic"])
def test_sdk_clients_raise_their_own_error_types(served, model_id, client_kind):
    import anthropic
    import openai

    if client_kind == "openai":
        c = openai_client(served[0])
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.BadRequestError, match="context"):
            c.chat.completions.create(model=model_id, messages=[{"role": "user", "content": LONG}])
    else:
        c = anthropic_client(served[0])
        with pytest.raises(anthropic.NotFoundError):
            c.messages.create(model="nope", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(anthropic.BadRequestError):
            c.messages.create(model=model_id, max_tokens=0, messages=[{"role": "user", "content": "hi"}])
