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
        ({"model": model, "messages": msgs, "n": 129}, 400, "n"),
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
        ({"model": model, "max_tokens": 4, "messages": [{"role": "tool", "content": "hi"}]}, 400,
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


def _user(content):
    return [{"role": "user", "content": content}]


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
WRONG_SHAPES = [  # (path, body without model, message, OpenAI param or None): each was a 500 (a TypeError or an
    # AttributeError inside) before
    ("/v1/chat/completions", {"messages": _user([{"type": "text", "text": 1}])},
     "messages[0].content[0].text: expected a string, got int", "messages.0.content"),
    ("/v1/chat/completions", {"messages": _user("hi") + [{"role": "assistant", "content": "",
                                                           "tool_calls": [{"id": "c", "function": "f"}]}]},
     "messages[1].tool_calls[0].function: expected an object with name and arguments, got str",
     "messages.1.tool_calls"),
    ("/v1/chat/completions", {"messages": _user("hi"), "tools": [{"type": "function", "function": "f"}]},
     "tools[0]: only function tools with a name are supported", "tools.0"),
    ("/v1/chat/completions", {"messages": _user("hi"), "tools": [TOOL],
                              "tool_choice": {"type": "function", "function": "f"}},
     "tool_choice.function: expected an object with a name, got str", "tool_choice"),
    ("/v1/chat/completions", {"messages": _user("hi"), "seed": 2**64},
     "seed must lie in [-9223372036854775808, 18446744073709551615] (torch's 64 bits), got 18446744073709551616",
     "seed"),
    ("/v1/completions", {"prompt": "hi", "seed": -2**63 - 1},
     "seed must lie in [-9223372036854775808, 18446744073709551615] (torch's 64 bits), got -9223372036854775809",
     "seed"),
    ("/v1/responses", {"input": [{"role": "user", "content": 1}]},
     "input[0].content: expected a string or a list of content parts, got int", "input.0.content"),
    ("/v1/responses", {"input": [{"role": "user", "content": ["hi"]}]},
     "input[0].content[0]: a content part is an object with a type, got str", "input.0.content"),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text": None}]}]},
     "input[0].content[0].text: expected a string, got NoneType", "input.0.content"),
    ("/v1/responses", {"input": "hi", "text": {"format": "json"}},
     "text.format: expected an object with a type, got str", "text.format"),
    ("/v1/messages", {"max_tokens": 2, "messages": _user([{"type": "text", "text": 1.5}])},
     "messages[0].content[0].text: expected a string, got float", None),
    ("/v1/messages/count_tokens", {"messages": _user([{"type": "text", "text": [1]}])},
     "messages[0].content[0].text: expected a string, got list", None),
    ("/v1/messages", {"max_tokens": 2, "messages": _user("hi"), "output_config": {"format": "json"}},
     'output_config.format: expected {"type": "json_schema", "schema": {...}}', None),
]


@pytest.mark.parametrize("path, body, message, param", WRONG_SHAPES)
def test_a_field_of_the_wrong_shape_is_a_400_naming_it(served, model_id, path, body, message, param):
    r = post(served.url + path, {"model": model_id, **body})
    assert r.status_code == 400, r.text
    if path.startswith("/v1/messages"):
        assert r.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    else:
        assert r.json()["error"] == {"message": message, "type": "invalid_request_error", "param": param,
                                     "code": None}


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": _user("hi")}),
    ("/v1/responses", {"input": "hi"}),
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/messages", {"max_tokens": 2, "messages": _user("hi")}),
])
def test_an_unknown_model_is_a_404_naming_both_models(served, model_id, path, body):
    r = post(served.url + path, {"model": "no-such-model", **body})
    message = f"model 'no-such-model' does not exist; this server serves {model_id!r}"
    assert r.status_code == 404, r.text
    if path == "/v1/messages":
        assert r.json() == {"type": "error", "error": {"type": "not_found_error", "message": message}}
    else:
        assert r.json()["error"] == {"message": message, "type": "invalid_request_error", "param": "model",
                                     "code": "model_not_found"}
