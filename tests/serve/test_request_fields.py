"""Request fields that change the output, through the official clients against the demo server: logprobs against
the engine's own log-softmax, logit_bias, presence / frequency penalties against the formula applied to the
engine's logits, grammar-constrained JSON (json_object, json_schema, forced tool choice) checked with jsonschema,
and every known field this server does not implement refused with a 400 naming it."""

from __future__ import annotations

import json
import math

import httpx
import jsonschema
import pytest
import torch

from conftest import TIMEOUT, anthropic_client, openai_client

PROMPT = "hello there"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
             "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
             "required": ["city"], "additionalProperties": False}}},
         {"type": "function", "function": {"name": "add", "parameters": {
             "type": "object", "properties": {"a": {"type": "integer", "maximum": 99},
                                              "b": {"type": "integer", "maximum": 99}},
             "required": ["a", "b"], "additionalProperties": False}}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def client(served):
    return openai_client(served[0])


@pytest.fixture(scope="module")
def aclient(served):
    return anthropic_client(served[0])


def chat(client, model_id, text=PROMPT, **kw):
    return client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": text}],
                                          temperature=0, **kw)


def test_logprobs_are_the_engines_log_softmax(client, model_id, engine_steps):
    r = chat(client, model_id, max_tokens=5, logprobs=True, top_logprobs=4)
    content = r.choices[0].logprobs.content
    ids, logprobs = engine_steps(PROMPT, len(content))
    assert len(content) == r.usage.completion_tokens == 5
    for lp, tok, ref in zip(content, ids, logprobs):
        assert lp.logprob == lp.top_logprobs[0].logprob and lp.token == lp.top_logprobs[0].token  # greedy = top
        assert math.isclose(lp.logprob, float(ref[tok]), abs_tol=1e-4)
        best = torch.topk(ref, 4).values.tolist()
        assert [t.logprob for t in lp.top_logprobs] == pytest.approx(best, abs=1e-4)
    streamed = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": PROMPT}],
                                              temperature=0, max_tokens=5, logprobs=True, stream=True)
    lps = [lp.logprob for ch in streamed for lp in ((ch.choices[0].logprobs.content or [])
                                                    if ch.choices and ch.choices[0].logprobs else [])]
    assert lps == pytest.approx([lp.logprob for lp in content], abs=1e-5)  # the prompt KV now comes from the prefix cache


def test_logit_bias_makes_greedy_repeat_a_token(client, model_id, served):
    tok = served[1].backend.chat.tok
    target = tok.encode(" memory", add_special_tokens=False)[0]
    plain = chat(client, model_id, max_tokens=6)
    assert plain.choices[0].message.content != tok.decode([target] * 6)
    r = chat(client, model_id, max_tokens=6, logit_bias={str(target): 100})
    assert r.choices[0].message.content == tok.decode([target] * 6) and r.usage.completion_tokens == 6


@pytest.mark.parametrize("kind", ["frequency_penalty", "presence_penalty"])
def test_penalties_follow_openais_formula(client, model_id, engine_steps, kind):
    def shape(logits, ids):
        for t in set(ids):
            logits[t] -= 1.5 * ids.count(t) if kind == "frequency_penalty" else 1.5
        return logits

    expect, _ = engine_steps(PROMPT, 12, shape)
    plain, _ = engine_steps(PROMPT, 12)
    assert expect != plain  # the penalty changes this output, so the comparison below can fail
    r = chat(client, model_id, max_tokens=12, **{kind: 1.5})
    tok = client_tokenizer(client)
    assert r.choices[0].message.content == tok.decode(expect, skip_special_tokens=True)


def client_tokenizer(_client):
    from freetoken.models.tokenizer import load_tokenizer
    from freetoken.paths import DEMO_MODEL

    return load_tokenizer(DEMO_MODEL)


def test_json_object_parses_where_plain_text_does_not(client, model_id):
    text = "Give me JSON"
    plain = chat(client, model_id, text, max_tokens=32).choices[0].message.content
    with pytest.raises(json.JSONDecodeError):
        json.loads(plain)
    r = chat(client, model_id, text, max_tokens=32, response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict) and r.choices[0].finish_reason == "stop"


def test_json_schema_reply_validates(client, model_id):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    r = chat(client, model_id, max_tokens=64, response_format=fmt)
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_forced_tool_choice_gives_a_valid_call(client, model_id, choice):
    r = chat(client, model_id, max_tokens=64, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    if isinstance(choice, dict):
        assert calls[0].function.name == "add"
    jsonschema.validate(json.loads(calls[0].function.arguments), SCHEMAS[calls[0].function.name])


@pytest.mark.parametrize("choice", [{"type": "any", "disable_parallel_tool_use": True},
                                    {"type": "tool", "name": "get_weather"}])
def test_anthropic_forced_tool_choice(aclient, model_id, choice):
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
    m = aclient.messages.create(model=model_id, max_tokens=64, messages=[{"role": "user", "content": PROMPT}],
                                tools=tools, tool_choice=choice, extra_body={"temperature": 0})
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and len(uses) == 1
    if choice["type"] == "tool":
        assert uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, SCHEMAS[uses[0].name])


def test_anthropic_output_format_validates(aclient, model_id):
    m = aclient.messages.create(model=model_id, max_tokens=64, messages=[{"role": "user", "content": PROMPT}],
                                extra_body={"temperature": 0, "output_config": {
                                    "format": {"type": "json_schema", "schema": PERSON}}})
    jsonschema.validate(json.loads(m.content[0].text), PERSON)


def openai_refusals(model):
    base = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return [({**base, "audio": {"voice": "x"}}, "audio"), ({**base, "prediction": {"type": "content"}}, "prediction"),
            ({**base, "web_search_options": {}}, "web_search_options"),
            ({**base, "use_beam_search": True}, "use_beam_search"),
            ({**base, "logits_processors": ["x"]}, "logits_processors"),
            ({**base, "functions": [{"name": "f"}]}, "functions"), ({**base, "store": True}, "store"),
            ({**base, "modalities": ["audio"]}, "modalities"), ({**base, "top_logprobs": 2}, "top_logprobs"),
            ({**base, "logit_bias": {"999999": 5}}, "logit_bias"), ({**base, "tool_choice": "required"}, "tool_choice"),
            ({**base, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
            ({**base, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
             "tool_choice")]


def test_known_openai_fields_act_or_are_refused_by_name(served, model_id):
    for body, field in openai_refusals(model_id):
        r = httpx.post(served[0] + "/v1/chat/completions", json=body, timeout=TIMEOUT)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, r.text)
    r = httpx.post(served[0] + "/v1/responses", json={"model": model_id, "input": "hi",
                                                      "previous_response_id": "resp_1"}, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "previous_response_id"
    ok = {"model": model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "user": "u1",
          "metadata": {"k": "v"}, "some_future_field": 1}  # no effect on output / unknown: accepted
    assert httpx.post(served[0] + "/v1/chat/completions", json=ok, timeout=TIMEOUT).status_code == 200


@pytest.mark.parametrize("extra, word", [({"container": "c1"}, "container"), ({"mcp_servers": [{"url": "x"}]},
                                                                                 "mcp_servers"),
                                         ({"thinking": {"type": "enabled", "budget_tokens": 99}}, "budget_tokens"),
                                         ({"output_config": {"format": {"type": "regex"}}}, "output_config"),
                                         ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
                                          "web_search")])
def test_known_anthropic_fields_act_or_are_refused_by_name(served, model_id, extra, word):
    body = {"model": model_id, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **extra}
    r = httpx.post(served[0] + "/v1/messages", json=body, timeout=TIMEOUT)
    assert r.status_code == 400 and word in r.json()["error"]["message"], r.text
