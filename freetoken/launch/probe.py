"""What `ft launch` asks a running server before it writes an agent's config: is it answering, does it want a key
(and take the one given), which model it serves, its context, and how many tokens the agent's first request is
there. The first request is the agent's own, recorded (first_requests/<agent>.json, from tests/clients/fixtures),
counted by the server's count endpoint for that agent's API, so the number is this model's template and tokenizer."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

FIRST_REQUESTS = Path(__file__).resolve().parent / "first_requests"
# agent -> (count endpoint of its API, the recorded body's fields that endpoint takes, the reply's count field)
COUNTERS = {
    "claude": ("/v1/messages/count_tokens", ("messages", "system", "tools", "thinking"), "input_tokens"),
    "codex": ("/v1/responses/input_tokens", ("input", "instructions", "tools"), "input_tokens"),
    "opencode": ("/tokenize", ("messages", "tools"), "count"),
}


@dataclass(frozen=True, slots=True)
class ServerInfo:
    answering: bool
    keyed: bool = False  # it refused the request for want of a key, or for the wrong one
    key_sent: bool = False
    model: str | None = None
    max_context: int | None = None  # served
    model_context: int | None = None  # the model's own (config.json), the most --max-context can serve


def _request(url: str, key: str | None, body: dict | None = None, timeout: float = 2.0):
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if key:
        headers.update({"Authorization": f"Bearer {key}", "x-api-key": key})
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout) as r:
        return json.load(r)


def probe(origin: str, key: str | None) -> ServerInfo:
    """/v1/models with the key (a 401 means keyed), then /health (never keyed) for the context."""
    try:
        model = _request(f"{origin}/v1/models", key)["data"][0]["id"]
    except urllib.error.HTTPError as e:
        if e.code == 401:
            return ServerInfo(True, keyed=True, key_sent=bool(key))
        return ServerInfo(True)
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return ServerInfo(False)
    try:
        health = _request(f"{origin}/health", None)
        return ServerInfo(True, model=model, max_context=health.get("max_context"),
                          model_context=health.get("model_context"))
    except (OSError, ValueError, AttributeError):
        return ServerInfo(True, model=model)


def first_request_tokens(origin: str, key: str | None, agent: str, model: str) -> int | None:
    """The server's token count of the agent's recorded first request; None if it cannot say."""
    path = FIRST_REQUESTS / f"{agent}.json"
    if agent not in COUNTERS or not path.is_file():
        return None
    endpoint, fields, answer = COUNTERS[agent]
    recorded = json.loads(path.read_text())
    body = {"model": model, **{k: recorded[k] for k in fields if k in recorded}}
    try:
        return int(_request(origin + endpoint, key, body, timeout=30.0)[answer])
    except (OSError, ValueError, KeyError, TypeError):
        return None
