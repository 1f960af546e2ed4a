"""Real agents' recorded requests replayed against the server, each reply read by the client's own SDK: Claude
Code's /v1/messages (beta header, system message inside messages, adaptive thinking, context_management) through
anthropic's stream helper, Codex's /v1/responses (namespace tools) through openai's Responses stream helper,
opencode's /v1/chat/completions through openai's chat stream helper. Each session's two turns are replayed in
order; checked: the SDK's streamed text equals its final object's, the prompt tokens equal the server's own count
endpoint for that body (what `ft launch` asks), and the second turn reuses the first turn's prefix."""

from __future__ import annotations

import inspect

import httpx
import pytest

from agent_server import KEY, TIMEOUT, agent_server, demo_32k, recorded  # noqa: F401  (fixtures)

SKIP_HEADERS = {"content-type", "content-length", "accept", "accept-encoding", "authorization", "x-api-key",
                "user-agent", "host", "connection"}


def split(method, body: dict) -> dict:
    """A recorded body as SDK keyword arguments: the fields the SDK method names, the rest as extra_body."""
    named = inspect.signature(method).parameters
    known = {k: v for k, v in body.items() if k in named and k != "stream"}
    extra = {k: v for k, v in body.items() if k not in named and k != "stream"}
    return {**known, **({"extra_body": extra} if extra else {})}


def headers(record: dict) -> dict:
    return {k: v for k, v in record["headers"].items() if k not in SKIP_HEADERS}


def api_requests(agent: str) -> list[dict]:
    return [r for r in recorded(agent) if r["method"] == "POST"]


def count(url: str, path: str, body: dict, field: str) -> int:
    r = httpx.post(url + path, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()[field]


def test_fixtures_are_the_clients_own(agent_server):
    """Each agent's session: its API requests, two turns (the second carries the first's answer), no key."""
    for agent, path, n in (("claude", "/v1/messages?beta=true", 2), ("codex", "/v1/responses", 2),
                           ("opencode", "/v1/chat/completions", 3)):
        posts = api_requests(agent)
        assert [r["path"] for r in posts] == [path] * n
        assert all(r["status"] == 200 and r["body"]["stream"] is True for r in posts)
        assert all(v == "<redacted>" for r in posts for k, v in r["headers"].items()
                   if k in ("authorization", "x-api-key"))


@pytest.mark.slow
def test_claude_code_session(agent_server):
    import anthropic

    url = agent_server.url
    client = anthropic.Anthropic(base_url=url, api_key=KEY, timeout=TIMEOUT, max_retries=0)
    for record in recorded("claude"):
        if record["method"] == "HEAD":  # Claude Code's connectivity probe of the base URL
            assert httpx.head(url + record["path"], timeout=TIMEOUT).status_code == 200
    finals = []
    for record in api_requests("claude"):
        body = record["body"]
        with client.beta.messages.stream(**split(client.beta.messages.stream, body),
                                         extra_headers=headers(record)) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        # the demo model samples (no seed in this API): a reply may end inside its thinking, with no text block
        kinds = [b.type for b in final.content]
        thought = kinds.count("thinking")
        assert kinds[:thought] == ["thinking"] * thought  # thinking first, as the client renders it
        assert "".join(b.text for b in final.content if b.type == "text") == text
        assert final.stop_reason in ("end_turn", "max_tokens")
        assert final.context_management.applied_edits[0].type == "clear_thinking_20251015"  # asked: keep all
        counted = count(url, "/v1/messages/count_tokens", {k: body[k] for k in ("model", "messages", "system",
                                                                                "tools", "thinking")},
                        "input_tokens")
        assert final.usage.input_tokens + final.usage.cache_read_input_tokens == counted
        finals.append(final)
    first, second = finals
    assert second.usage.cache_read_input_tokens > first.usage.input_tokens // 2  # the first turn's prefix reused


@pytest.mark.slow
def test_codex_session(agent_server):
    import openai

    url = agent_server.url
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, timeout=TIMEOUT, max_retries=0)
    finals = []
    for record in api_requests("codex"):
        body = record["body"]
        assert any(t["type"] == "namespace" for t in body["tools"])  # Codex's sub-agent tools
        with client.responses.stream(**split(client.responses.stream, body), extra_headers=headers(record)) as s:
            text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
            final = s.get_final_response()
        assert final.status in ("completed", "incomplete") and final.output_text == text
        counted = count(url, "/v1/responses/input_tokens",
                        {k: body[k] for k in ("model", "input", "tools") if k in body}, "input_tokens")
        assert final.usage.input_tokens == counted
        finals.append(final)
    assert finals[1].usage.input_tokens_details.cached_tokens > finals[0].usage.input_tokens // 2


@pytest.mark.slow
def test_opencode_session(agent_server):
    import openai

    url = agent_server.url
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, timeout=TIMEOUT, max_retries=0)
    finals = []
    for record in api_requests("opencode"):
        body = record["body"]
        with client.chat.completions.stream(**split(client.chat.completions.stream, body),
                                            extra_headers=headers(record)) as s:
            text = "".join(e.delta for e in s if e.type == "content.delta")
            final = s.get_final_completion()
        choice = final.choices[0]
        assert choice.finish_reason in ("stop", "length") and (choice.message.content or "") == text
        counted = count(url, "/tokenize", {k: body[k] for k in ("model", "messages", "tools") if k in body},
                        "count")
        assert final.usage.prompt_tokens == counted
        finals.append(final)
    title, first, second = finals  # opencode's title request, then the session's two turns
    assert second.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens // 2


@pytest.mark.parametrize("agent", ["claude", "codex", "opencode"])
def test_launch_counts_the_agents_first_request(agent_server, agent):
    """What `ft launch` sends to find out whether the agent fits the served context: the recorded first request,
    counted by this server, equal to the tokens the replay's reply reports."""
    from freetoken.launch.probe import COUNTERS, first_request_tokens, probe
    from write_first_requests import first_request

    info = probe(agent_server.url, KEY)
    assert info.model == "freetoken-demo" and info.max_context == info.model_context == 32768
    n = first_request_tokens(agent_server.url, KEY, agent, info.model)
    endpoint, fields, answer = COUNTERS[agent]
    assert n == count(agent_server.url, endpoint, {"model": info.model, **first_request(agent)}, answer)
    assert 1000 < n < info.max_context
    no_key, wrong = probe(agent_server.url, None), probe(agent_server.url, "wrong")
    assert no_key.keyed and not no_key.key_sent and wrong.keyed and wrong.key_sent
