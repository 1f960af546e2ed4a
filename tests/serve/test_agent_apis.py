"""What coding agents send beyond the plain APIs: Claude Code's system messages inside messages, its
anthropic-beta values and context_management edits; Codex's namespace tools and built-in tools."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from conftest import TIMEOUT, anthropic_client, openai_client


def post(url, body, headers=None):
    return httpx.post(url + "/v1/messages", json=body, headers=headers or {}, timeout=TIMEOUT)


def test_system_messages_inside_messages_stay_in_place_where_the_template_renders_them(served, model_id):
    from freetoken.serve.chat import ChatTokenizer

    tok = served.service.backend.chat.tok
    messages = [{"role": "user", "content": "first"}, {"role": "system", "content": "be brief"},
                {"role": "user", "content": "second"}]
    body = {"model": model_id, "max_tokens": 1, "system": "top", "messages": messages}
    counted = httpx.post(served.url + "/v1/messages/count_tokens", json=body, timeout=TIMEOUT).json()["input_tokens"]
    rendered = tok.apply_chat_template([{"role": "system", "content": "top"}, *messages], tokenize=False,
                                       add_generation_prompt=True)
    assert counted == len(tok.encode(rendered, add_special_tokens=False))  # ChatML renders it where it stands
    assert post(served.url, body).status_code == 200
    strict = ChatTokenizer(tok)  # a template that refuses a system message after the first (Mistral's do)
    strict.template = ("{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
                       "{{ raise_exception('system only first') }}{% endif %}[{{ m.role }}] {{ m.content }}\n"
                       "{% endfor %}")
    text = strict.tok.decode(strict.render([{"role": "system", "content": "top"}, *messages]).tokens)
    assert text == "[system] top\n\nbe brief\n[user] first\n[user] second\n"


@pytest.mark.parametrize("beta, status", [("claude-code-20250219,interleaved-thinking-2025-05-14", 200),
                                          ("mid-conversation-system-2026-04-07,context-management-2025-06-27", 200),
                                          ("computer-use-2025-01-24", 400), ("files-api-2025-04-14", 400),
                                          ("some-future-beta-2099-01-01", 200)])
def test_beta_values_accepted_or_refused_by_name(served, model_id, beta, status, caplog):
    body = {"model": model_id, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    with caplog.at_level(logging.WARNING, logger="freetoken.serve"):
        r = post(served.url, body, {"anthropic-beta": beta})
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["message"].startswith(f"anthropic-beta: {beta} is not supported by this server")
    if "future" in beta:
        assert "ignoring unknown anthropic-beta value 'some-future-beta-2099-01-01'" in caplog.text


REASONING_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n"
                      "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
                      "{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")


def test_clear_thinking_edits_carried_out_before_rendering(served, model_id, monkeypatch):
    """Three assistant turns with thinking, keep 1: the first two lose their thinking blocks before the prompt is
    rendered (a template that replays reasoning shows the difference); the reply reports the turns and tokens
    cleared, equal to the same template rendered by HF with and without them."""
    chat = served.service.backend.chat
    monkeypatch.setattr(chat, "template", REASONING_TEMPLATE)

    def turn(i):
        return [{"role": "user", "content": f"q{i}"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": f"step {i} " * 5,
                                                   "signature": "s"}, {"type": "text", "text": f"a{i}"}]}]

    messages = [m for i in range(3) for m in turn(i)] + [{"role": "user", "content": "next"}]
    body = {"model": model_id, "max_tokens": 2, "messages": messages, "context_management": {
        "edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]}}
    r = post(served.url, body).json()
    (edit,) = r["context_management"]["applied_edits"]

    def hf(keep_all):
        flat = []
        for i, m in enumerate(messages):
            if isinstance(m["content"], list):
                thinking = m["content"][0]["thinking"] if keep_all or i == 5 else None
                flat.append({"role": "assistant", "content": m["content"][1]["text"], "reasoning_content": thinking})
            else:
                flat.append(m)
        return len(chat.tok.encode(chat.tok.apply_chat_template(flat, chat_template=REASONING_TEMPLATE,
                                                                tokenize=False), add_special_tokens=False))

    assert edit == {"type": "clear_thinking_20251015", "cleared_thinking_turns": 2,
                    "cleared_input_tokens": hf(True) - hf(False)} and edit["cleared_input_tokens"] > 0
    assert r["usage"]["input_tokens"] + r["usage"]["cache_read_input_tokens"] == hf(False)
    keep_all = {**body, "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}
    r = post(served.url, keep_all).json()
    assert r["context_management"]["applied_edits"][0]["cleared_thinking_turns"] == 0
    assert r["usage"]["input_tokens"] + r["usage"]["cache_read_input_tokens"] == hf(True)


def test_context_edits_it_cannot_carry_out_are_a_400_naming_them(served, model_id):
    base = {"model": model_id, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    for edit, where in (({"type": "clear_tool_uses_20250919"}, "context_management.edits[0].type: "
                                                               "'clear_tool_uses_20250919' is not an edit"),
                        ({"type": "compact_20260112"}, "context_management.edits[0].type: 'compact_20260112'"),
                        ({"type": "clear_thinking_20251015", "keep": 3},
                         "context_management.edits[0].keep: expected")):
        r = post(served.url, {**base, "context_management": {"edits": [edit]}})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith(where), r.text


NAMESPACE = {"type": "namespace", "name": "agents", "description": "sub-agents",
             "tools": [{"type": "function", "name": "spawn", "parameters": {
                 "type": "object", "properties": {"task": {"type": "string", "maxLength": 8}}, "required": ["task"],
                 "additionalProperties": False}}]}


@pytest.mark.slow
def test_codex_namespace_tools_come_back_with_their_namespace(served, model_id):
    c = openai_client(served.url)
    kw = dict(model=model_id, input="delegate", tools=[NAMESPACE], tool_choice="required", max_output_tokens=200,
              parallel_tool_calls=False,
              temperature=0)
    r = c.responses.create(**kw)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert (call.name, call.namespace) == ("spawn", "agents") and len(json.loads(call.arguments)["task"]) <= 8
    with c.responses.stream(**kw) as s:
        final = s.get_final_response()
    (call,) = [o for o in final.output if o.type == "function_call"]
    assert (call.name, call.namespace) == ("spawn", "agents")
    replay = c.responses.create(model=model_id, max_output_tokens=2, tools=[NAMESPACE], input=[
        {"type": "message", "role": "user", "content": "delegate"},
        {"type": "function_call", "call_id": "c1", "name": "spawn", "namespace": "agents", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "done"}])
    assert replay.status in ("completed", "incomplete")


@pytest.mark.parametrize("tool", [{"type": "web_search", "external_web_access": False}, {"type": "file_search"},
                                  {"type": "custom", "name": "apply_patch"}])
def test_built_in_tools_are_a_400_naming_them(served, model_id, tool):
    r = httpx.post(served.url + "/v1/responses", timeout=TIMEOUT, json={
        "model": model_id, "input": "hi", "tools": [NAMESPACE["tools"][0], tool]})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == f"tools[1]: a {tool['type']!r} tool cannot run on this server " \
                                           f"(function tools only)"
    assert r.json()["error"]["param"] == "tools[1]"


EFFORT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                   "<|im_start|>assistant\n[effort {{ reasoning_effort | default('none') }}]"
                   "[flavor {{ flavor | default('none') }}]")


@pytest.mark.slow
def test_template_variables_reach_the_template(served, model_id, monkeypatch):
    """reasoning_effort and chat_template_kwargs (chat), reasoning.effort (Responses), output_config.effort
    (Anthropic) are chat-template variables: the prompt is what HF renders with them."""
    chat = served.service.backend.chat
    monkeypatch.setattr(chat, "template", EFFORT_TEMPLATE)

    def hf(messages, **kw):
        text = chat.tok.apply_chat_template(messages, chat_template=EFFORT_TEMPLATE, tokenize=False, **kw)
        return len(chat.tok.encode(text, add_special_tokens=False))

    user = [{"role": "user", "content": "hi"}]
    c = openai_client(served.url)
    r = c.chat.completions.create(model=model_id, messages=user, max_tokens=1, reasoning_effort="high",
                                  extra_body={"chat_template_kwargs": {"flavor": "mint"}})
    assert r.usage.prompt_tokens == hf(user, reasoning_effort="high", flavor="mint") != hf(user)
    r = c.responses.create(model=model_id, input="hi", instructions="sys", max_output_tokens=1,
                           reasoning={"effort": "low"})
    assert r.usage.input_tokens == hf([{"role": "system", "content": "sys"}, *user], reasoning_effort="low")
    m = anthropic_client(served.url).messages.create(model=model_id, max_tokens=1, messages=user,
                                                     extra_body={"output_config": {"effort": "medium"}})
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == hf(user, reasoning_effort="medium",
                                                                        enable_thinking=False)
