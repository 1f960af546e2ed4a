"""Anthropic Messages API: request schema, conversion to a ChatInput, the message object and its stream events
(message_start, content_block_start/delta/stop, message_delta, message_stop) as Anthropic's SDK reads them."""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import Field

from freetoken.serve.chat import ChatInput, Params, text_of, tool_call
from freetoken.serve.errors import APIError
from freetoken.serve.openai_api import Lenient
from freetoken.serve.service import Delta, Done

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class AnthropicMessage(Lenient):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class MessagesRequest(Lenient):
    model: str
    max_tokens: int = Field(ge=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None


class CountTokensRequest(Lenient):
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None


def _blocks_text(blocks: list[dict], where: str) -> str:
    try:
        return text_of(blocks, where)
    except ValueError as e:
        raise APIError(400, str(e))


def _messages(system, messages: list[AnthropicMessage]) -> list[dict]:
    out = []
    if system:
        out.append({"role": "system", "content": system if isinstance(system, str) else _blocks_text(system, "system")})
    for i, m in enumerate(messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        text, calls = [], []
        for j, block in enumerate(m.content):
            kind = block.get("type")
            if kind == "text":
                text.append(block.get("text", ""))
            elif kind == "tool_use" and m.role == "assistant":
                calls.append(tool_call(block.get("name", ""), block.get("input", {}), block.get("id")))
            elif kind == "tool_result" and m.role == "user":
                result = block.get("content", "")
                result = result if isinstance(result, str) else _blocks_text(result, f"messages[{i}].content[{j}]")
                out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": result})
            elif kind in ("thinking", "redacted_thinking"):
                continue  # earlier reasoning is not replayed into the prompt
            else:
                raise APIError(400, f"messages[{i}].content[{j}]: block type {kind!r} is not supported here")
        if text or calls:
            msg = {"role": m.role, "content": "".join(text)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def _tools(tools: list[dict] | None, tool_choice: dict | None) -> list[dict] | None:
    if not tools or (tool_choice or {}).get("type") == "none":
        return None
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t.get("name"), str):
            raise APIError(400, f"tools[{i}]: a tool needs a name")
        if "input_schema" not in t:
            continue  # server tools (bash, web search, ...) have no schema to show the model
        out.append({"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                     "parameters": t["input_schema"]}})
    return out or None


def messages_input(req: MessagesRequest) -> ChatInput:
    params = Params(req.max_tokens, 1.0 if req.temperature is None else req.temperature,
                    1.0 if req.top_p is None else req.top_p, req.top_k or 0, list(req.stop_sequences or []))
    return ChatInput(_messages(req.system, req.messages), _tools(req.tools, req.tool_choice), params)


def count_tokens_input(req: CountTokensRequest) -> ChatInput:
    return ChatInput(_messages(req.system, req.messages), _tools(req.tools, None), Params())


class MessageBuilder:
    def __init__(self, model: str):
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        self.model = model

    def _base(self, content: list, stop_reason, stop_sequence, usage: dict) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}

    @staticmethod
    def usage(done: Done) -> dict:
        return {"input_tokens": done.prompt_tokens - done.cached_tokens, "output_tokens": done.completion_tokens,
                "cache_read_input_tokens": done.cached_tokens, "cache_creation_input_tokens": 0}

    @staticmethod
    def stop_reason(done: Done) -> tuple[str, str | None]:
        if done.stop is not None:
            return "stop_sequence", done.stop
        return STOP_REASONS[done.finish], None

    def message(self, done: Done) -> dict:
        content = [{"type": "text", "text": done.text}] if done.text or not done.tool_calls else []
        content += [{"type": "tool_use", "id": f"toolu_{c.id[5:]}", "name": c.name, "input": json.loads(c.arguments)}
                    for c in done.tool_calls]
        return self._base(content, *self.stop_reason(done), self.usage(done))

    # stream: (event name, data) pairs
    def start_events(self, prompt_tokens: int) -> list[tuple[str, dict]]:
        usage = {"input_tokens": prompt_tokens, "output_tokens": 0}
        return [("message_start", {"type": "message_start", "message": self._base([], None, None, usage)}),
                ("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": {"type": "text", "text": ""}}),
                ("ping", {"type": "ping"})]

    def events(self, event: Delta | Done) -> list[tuple[str, dict]]:
        if isinstance(event, Delta):
            return [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                             "delta": {"type": "text_delta", "text": event.text}})]
        out = [("content_block_stop", {"type": "content_block_stop", "index": 0})]
        for i, c in enumerate(event.tool_calls, start=1):
            block = {"type": "tool_use", "id": f"toolu_{c.id[5:]}", "name": c.name, "input": {}}
            out += [("content_block_start", {"type": "content_block_start", "index": i, "content_block": block}),
                    ("content_block_delta", {"type": "content_block_delta", "index": i,
                                             "delta": {"type": "input_json_delta", "partial_json": c.arguments}}),
                    ("content_block_stop", {"type": "content_block_stop", "index": i})]
        reason, seq = self.stop_reason(event)
        usage = self.usage(event)
        out += [("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                                   "usage": usage}),
                ("message_stop", {"type": "message_stop"})]
        return out
