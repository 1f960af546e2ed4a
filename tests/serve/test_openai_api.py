"""The OpenAI APIs through the official `openai` client against the real server: greedy text equals the engine's
own generate on the same chat prompt, streamed equals non-streamed, usage counts are the prompt's token count."""

from __future__ import annotations

import pytest

from conftest import openai_client

from test_textstream import clean_stop

PROMPT = "hello there"


@pytest.fixture(scope="module")
def client(served):
    return openai_client(served[0])


def chat(client, model_id, text=PROMPT, **kw):
    return client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": text}],
                                          temperature=0, **kw)


def test_models_lists_the_served_model(client, model_id):
    assert [m.id for m in client.models.list().data] == [model_id]


def test_greedy_chat_equals_engine_generate(client, model_id, greedy):
    g = greedy(PROMPT, 6)
    r = chat(client, model_id, max_tokens=6)
    assert r.choices[0].message.content == g.text
    assert r.choices[0].finish_reason == g.finish == "length"
    assert r.usage.prompt_tokens == g.prompt_tokens
    assert r.usage.completion_tokens == len(g.out) == 6
    assert r.usage.total_tokens == g.prompt_tokens + 6


def test_stream_equals_non_stream_with_usage(client, model_id, greedy):
    g = greedy(PROMPT, 6)
    chunks = list(chat(client, model_id, max_tokens=6, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == g.text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == g.prompt_tokens
    assert chunks[-1].usage.completion_tokens == 6


def test_stop_string_cuts_the_text(client, model_id, greedy):
    text = greedy(PROMPT, 6).text
    stop = clean_stop(text)  # a stop string inside the greedy text: output is what came before its first occurrence
    cut = text[: text.find(stop)]
    r = chat(client, model_id, max_tokens=6, stop=[stop])
    assert r.choices[0].message.content == cut and r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in chat(client, model_id, max_tokens=6, stop=stop,
                                                                        stream=True) if c.choices)
    assert streamed == cut


def test_seeded_sampling_is_reproducible(client, model_id):
    kw = dict(max_tokens=5, seed=7, top_p=0.9)
    a = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "x"}],
                                       temperature=1.0, **kw)
    b = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "x"}],
                                       temperature=1.0, **kw)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_tools_and_tool_history_reach_the_prompt(tiny_client, tiny_model_id, tiny_engine):
    """On the tiny model, whose chat template renders tools (the demo's does not)."""
    client, model_id = tiny_client, tiny_model_id
    tools = [{"type": "function", "function": {"name": "list_dir", "description": "List a directory",
                                               "parameters": {"type": "object",
                                                              "properties": {"path": {"type": "string"}}}}}]
    messages = [{"role": "user", "content": "what is in /tmp?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "list_dir", "arguments": '{"path": "/tmp"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}]
    r = client.chat.completions.create(model=model_id, messages=messages, tools=tools, max_tokens=2,
                                       temperature=0)
    # the prompt the model saw is the chat template applied to exactly these messages and tools
    tok = tiny_engine.tokenizer
    expect = [{"role": "user", "content": "what is in /tmp?"},
              {"role": "assistant", "content": "", "tool_calls": [
                  {"id": "call_1", "type": "function", "function": {"name": "list_dir",
                                                                    "arguments": {"path": "/tmp"}}}]},
              {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}]
    text = tok.apply_chat_template(expect, tools=tools, add_generation_prompt=True, tokenize=False)
    assert '"list_dir"' in text and "a.txt" in text
    assert r.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False))


def test_responses_api_non_stream_and_stream(client, model_id, greedy):
    g = greedy(PROMPT, 6)
    r = client.responses.create(model=model_id, input=PROMPT, max_output_tokens=6, temperature=0)
    assert r.output_text == g.text
    assert r.usage.input_tokens == g.prompt_tokens and r.usage.output_tokens == 6
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    with client.responses.stream(model=model_id, input=[{"role": "user", "content": PROMPT}],
                                 max_output_tokens=6, temperature=0) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == g.text
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert kinds.count("response.output_text.delta") >= 1
