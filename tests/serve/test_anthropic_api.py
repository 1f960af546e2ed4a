"""Anthropic Messages through the official `anthropic` client: the same greedy text as the engine, the stream's
events in the order the SDK expects, usage, stop sequences."""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import TIMEOUT, anthropic_client

from test_textstream import clean_stop

PROMPT = "hello there"
GREEDY = {"temperature": 0}  # this SDK version takes sampling settings only as extra body fields


@pytest.fixture(scope="module")
def client(served):
    return anthropic_client(served[0])


def test_message_equals_engine_greedy(client, model_id, greedy):
    g = greedy(PROMPT, 6)
    m = client.messages.create(model=model_id, max_tokens=6, messages=[{"role": "user", "content": PROMPT}],
                               extra_body=GREEDY)
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == g.text
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None
    assert m.usage.output_tokens == 6
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == g.prompt_tokens


def test_stream_through_the_sdk_helper(client, model_id, greedy):
    g = greedy(PROMPT, 6)
    with client.messages.stream(model=model_id, max_tokens=6, messages=[{"role": "user", "content": PROMPT}],
                                extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == g.text and final.content[0].text == g.text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 6


def test_raw_event_order(served, model_id, greedy):
    g = greedy(PROMPT, 6)
    body = {"model": model_id, "max_tokens": 6, "stream": True, "temperature": 0,
            "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}]}
    events = []
    with httpx.stream("POST", served[0] + "/v1/messages", json=body, timeout=TIMEOUT) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name  # every event name matches its payload's type
                events.append(data)
    kinds = [e["type"] for e in events]
    deltas = [e for e in events if e["type"] == "content_block_delta"]
    assert kinds == (["message_start", "content_block_start", "ping"] + ["content_block_delta"] * len(deltas)
                     + ["content_block_stop", "message_delta", "message_stop"])
    assert events[0]["message"]["content"] == [] and events[0]["message"]["usage"]["input_tokens"] == g.prompt_tokens
    assert "".join(d["delta"]["text"] for d in deltas) == g.text
    assert events[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}


def test_stop_sequence(client, model_id, greedy):
    g = greedy(PROMPT, 6)
    stop = clean_stop(g.text)
    m = client.messages.create(model=model_id, max_tokens=6, stop_sequences=[stop],
                               messages=[{"role": "user", "content": PROMPT}], extra_body=GREEDY)
    assert m.content[0].text == g.text[: g.text.find(stop)]
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", stop)


def test_system_and_tool_blocks_render_and_count(tiny_served, tiny_engine):
    """On the tiny model, whose chat template renders tools (the demo's does not)."""
    client = anthropic_client(tiny_served.url)
    model_id = tiny_served.model_id
    tools = [{"name": "read", "description": "Read a file", "input_schema": {"type": "object"}}]
    messages = [{"role": "user", "content": "read a.txt"},
                {"role": "assistant", "content": [{"type": "text", "text": "ok"},
                                                  {"type": "tool_use", "id": "toolu_1", "name": "read",
                                                   "input": {"path": "a.txt"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "hi"}]}]
    counted = client.messages.count_tokens(model=model_id, system="be brief", messages=messages, tools=tools)
    tok = tiny_engine.tokenizer
    expect = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "read a.txt"},
              {"role": "assistant", "content": "ok", "tool_calls": [
                  {"id": "toolu_1", "type": "function", "function": {"name": "read", "arguments": {"path": "a.txt"}}}]},
              {"role": "tool", "tool_call_id": "toolu_1", "content": "hi"}]
    fn = [{"type": "function", "function": {"name": "read", "description": "Read a file",
                                            "parameters": {"type": "object"}}}]
    text = tok.apply_chat_template(expect, tools=fn, add_generation_prompt=True, tokenize=False)
    assert counted.input_tokens == len(tok.encode(text, add_special_tokens=False))
    m = client.messages.create(model=model_id, max_tokens=2, system="be brief", messages=messages, tools=tools,
                               extra_body=GREEDY)
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == counted.input_tokens
