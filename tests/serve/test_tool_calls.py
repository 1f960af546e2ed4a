"""Tool calls end to end through the server and the official clients. A random-weight model never writes a tool
call, so here the backend replays a fixed answer (token ids of the tiny model's tokenizer): what is tested is the
server's parsing and each API's tool-call shapes, streamed and not."""

from __future__ import annotations

import json

import pytest

from conftest import anthropic_client, openai_client

ANSWER = 'Let me look.<tool_call>\n{"name": "list_dir", "arguments": {"path": "/tmp"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "list_dir", "parameters": {"type": "object"}}}]


class Replay:
    """Generation that yields fixed ids, then stops."""

    def __init__(self, ids):
        self._it = iter(ids)
        self.reused_tokens = 0
        self.prompt_logprobs = None
        self.started, self.finished = True, False  # no prefill: every step yields a token

    def __next__(self):
        try:
            return next(self._it)
        except StopIteration:
            self.finished = True
            raise

    def close(self):
        pass


class ReplayBackend:
    def __init__(self, tokenizer, answer: str):
        from freetoken.serve.chat import ChatTokenizer

        from freetoken.models.generation_config import GenerationDefaults

        self.model_id, self.max_context = "replay", 1024
        self.model_context = self.max_context
        self.chat = ChatTokenizer(tokenizer)
        self.stop_token_ids = {tokenizer.eos_token_id}
        self.ids = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
        self.family, self.vocab_size, self.generation_defaults = "qwen3_moe", len(tokenizer), GenerationDefaults()

    def generate(self, prompt, decoder, max_new, stop_token_ids=None):
        return Replay(self.ids[:max_new])

    def stats(self):
        return {"backend": "replay"}


@pytest.fixture(scope="module", params=[ANSWER, "no call here <tool_call>{broken"], ids=["call", "broken"])
def replay(request, tiny_engine):
    from freetoken.serve.app import build_app
    from freetoken.serve.server import Server
    from freetoken.serve.service import Service

    service = Service(ReplayBackend(tiny_engine.tokenizer, request.param))
    server = Server(build_app(service), "127.0.0.1", 0, announce=False)
    thread = server.start_in_thread()
    yield server.url, request.param
    server.stop(thread)
    service.shutdown()


def test_openai_tool_calls(replay):
    url, answer = replay
    c = openai_client(url)
    kw = dict(model="replay", messages=[{"role": "user", "content": "ls /tmp"}], tools=TOOLS)
    r = c.chat.completions.create(**kw)
    chunks = list(c.chat.completions.create(**kw, stream=True))
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    deltas = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    if answer == ANSWER:
        (call,) = r.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("list_dir", {"path": "/tmp"})
        assert r.choices[0].message.content == "Let me look." and r.choices[0].finish_reason == "tool_calls"
        assert streamed == "Let me look." and finish == ["tool_calls"]
        assert [(d.function.name, d.function.arguments) for d in deltas] == [("list_dir", '{"path": "/tmp"}')]
    else:  # a malformed call stays text, streamed in full
        assert r.choices[0].message.tool_calls is None and r.choices[0].message.content == answer
        assert streamed == answer and deltas == [] and finish == ["stop"]


def test_anthropic_tool_use(replay):
    url, answer = replay
    c = anthropic_client(url)
    kw = dict(model="replay", max_tokens=200, messages=[{"role": "user", "content": "ls /tmp"}],
              tools=[{"name": "list_dir", "input_schema": {"type": "object"}}])
    m = c.messages.create(**kw)
    with c.messages.stream(**kw) as s:
        final = s.get_final_message()
    for msg in (m, final):
        if answer == ANSWER:
            assert [b.type for b in msg.content] == ["text", "tool_use"] and msg.stop_reason == "tool_use"
            assert (msg.content[1].name, msg.content[1].input) == ("list_dir", {"path": "/tmp"})
            assert msg.content[0].text == "Let me look."
        else:
            assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == answer
            assert msg.stop_reason == "end_turn"


def test_responses_function_call(replay):
    url, answer = replay
    c = openai_client(url)
    kw = dict(model="replay", input="ls /tmp", tools=[{"type": "function", "name": "list_dir",
                                                      "parameters": {"type": "object"}}])
    r = c.responses.create(**kw)
    with c.responses.stream(**kw) as s:
        final = s.get_final_response()
    for resp in (r, final):
        calls = [o for o in resp.output if o.type == "function_call"]
        if answer == ANSWER:
            assert [(o.name, json.loads(o.arguments)) for o in calls] == [("list_dir", {"path": "/tmp"})]
            assert resp.output_text == "Let me look."
        else:
            assert calls == [] and resp.output_text == answer


THINK = "<think>look in /tmp</think>\n\nIt is empty."


@pytest.fixture(scope="module")
def think_replay(tiny_engine):
    """A Qwen3-family answer with reasoning (the family's parser: <think> blocks)."""
    from freetoken.serve.app import build_app
    from freetoken.serve.server import Server
    from freetoken.serve.service import Service

    service = Service(ReplayBackend(tiny_engine.tokenizer, THINK))
    server = Server(build_app(service), "127.0.0.1", 0, announce=False)
    thread = server.start_in_thread()
    yield server.url
    server.stop(thread)
    service.shutdown()


def test_reasoning_reaches_each_api_in_its_own_field(think_replay):
    url = think_replay
    c = openai_client(url)
    kw = dict(model="replay", messages=[{"role": "user", "content": "ls"}])
    msg = c.chat.completions.create(**kw).choices[0].message
    assert (msg.reasoning_content, msg.content) == ("look in /tmp", "It is empty.")
    chunks = [ch.choices[0].delta for ch in c.chat.completions.create(**kw, stream=True) if ch.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in chunks) == "look in /tmp"
    assert "".join(d.content or "" for d in chunks) == "It is empty."
    a = anthropic_client(url)
    akw = dict(model="replay", max_tokens=200, messages=[{"role": "user", "content": "ls"}])
    on = dict(thinking={"type": "enabled", "budget_tokens": 100})
    with a.messages.stream(**akw, **on) as s:
        streamed = s.get_final_message()
    for m in (a.messages.create(**akw, **on), streamed):
        assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in m.content] == [
            ("thinking", "look in /tmp"), ("text", "It is empty.")]
    m = a.messages.create(**akw)  # thinking not enabled: no thinking block
    assert [(b.type, b.text) for b in m.content] == [("text", "It is empty.")]


def test_thinking_adaptive_and_display_omitted(think_replay):
    """Claude Code sends thinking {"type": "adaptive"}: reasoning on, no budget; display "omitted" keeps the block
    but not its text."""
    a = anthropic_client(think_replay)
    akw = dict(model="replay", max_tokens=200, messages=[{"role": "user", "content": "ls"}])
    for spec, shown in (({"type": "adaptive"}, "look in /tmp"), ({"type": "adaptive", "display": "omitted"}, ""),
                        ({"type": "enabled", "budget_tokens": 100, "display": "omitted"}, "")):
        for m in (a.messages.create(**akw, thinking=spec), a.messages.stream(**akw, thinking=spec).__enter__()
                  .get_final_message()):
            assert [(b.type, b.thinking if b.type == "thinking" else b.text) for b in m.content] == [
                ("thinking", shown), ("text", "It is empty.")]
