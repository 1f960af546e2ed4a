"""Anthropic Messages API: request schema, conversion to a ChatInput, the message object and its stream events
(message_start, content_block_start/delta/stop, message_delta, message_stop) as Anthropic's SDK reads them."""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import Field

from freetoken.serve.anthropic_context import clear_thinking, context_edits, thinking_config
from freetoken.serve.chat import ChatInput, Params, part_text, text_of, tool_call
from freetoken.serve.errors import APIError
from freetoken.serve.fields import check_fields, forced_tool
from freetoken.serve.grammar import Constraint
from freetoken.serve.openai_api import Lenient
from freetoken.serve.output import tool_call_schema
from freetoken.serve.service import Delta, Done
from freetoken.serve.vllm_fields import check_stop

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
REFUSED = {"container": "no code-execution container", "mcp_servers": "no MCP connector"}
ACCEPTED = frozenset({"metadata", "service_tier"})


class AnthropicMessage(Lenient):
    role: Literal["user", "assistant", "system"]  # system: Claude Code's mid-conversation system messages
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
    thinking: dict[str, Any] | None = None  # {"type": "enabled", "budget_tokens": N} | adaptive | disabled
    context_management: dict[str, Any] | None = None  # {"edits": [{"type": "clear_thinking_20251015", ...}]}
    output_config: dict[str, Any] | None = None  # {"format": {"type": "json_schema", "schema": ...}, "effort"}


class CountTokensRequest(Lenient):
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    thinking: dict[str, Any] | None = None  # renders the prompt as /v1/messages would with it
    context_management: dict[str, Any] | None = None


def _blocks_text(blocks: list[dict], where: str) -> str:
    try:
        return text_of(blocks, where)
    except ValueError as e:
        raise APIError(400, str(e))


def _messages(system, messages: list[dict]) -> list[dict]:
    """Anthropic-form messages (dicts) in template form. Thinking blocks become the assistant message's
    reasoning_content (templates that replay reasoning read it, the others ignore it); system messages inside
    messages stay where they are (ChatTokenizer.render merges them where the template cannot place them)."""
    out = []
    if system:
        out.append({"role": "system", "content": system if isinstance(system, str) else _blocks_text(system, "system")})
    for i, m in enumerate(messages):
        role, content = m["role"], m["content"]
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if role == "system":
            out.append({"role": "system", "content": _blocks_text(content, f"messages[{i}].content")})
            continue
        text, calls, reasoning = [], [], []
        for j, block in enumerate(content):
            kind = block.get("type")
            if kind == "text":
                try:
                    text.append(part_text(block, "text", f"messages[{i}].content[{j}]"))
                except ValueError as e:
                    raise APIError(400, str(e), f"messages.{i}.content.{j}.text")
            elif kind == "tool_use" and role == "assistant":
                calls.append(tool_call(block.get("name", ""), block.get("input", {}), block.get("id")))
            elif kind == "tool_result" and role == "user":
                result = block.get("content", "")
                result = result if isinstance(result, str) else _blocks_text(result, f"messages[{i}].content[{j}]")
                out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": result})
            elif kind == "thinking" and role == "assistant":
                reasoning.append(block.get("thinking") or "")
            elif kind == "redacted_thinking":
                continue  # encrypted by Anthropic's servers: nothing to replay here
            else:
                raise APIError(400, f"messages[{i}].content[{j}]: block type {kind!r} is not supported here",
                               f"messages.{i}.content.{j}.type")
        if text or calls or reasoning:
            msg = {"role": role, "content": "".join(text)}
            if calls:
                msg["tool_calls"] = calls
            if reasoning:
                msg["reasoning_content"] = "".join(reasoning)
            out.append(msg)
    return out


def _tools(tools: list[dict] | None, tool_choice: dict | None) -> list[dict] | None:
    if not tools or (tool_choice or {}).get("type") == "none":
        return None
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t.get("name"), str):
            raise APIError(400, f"tools[{i}]: a tool needs a name")
        if "input_schema" not in t:  # server tools (web search, code execution, ...) run on Anthropic's side
            raise APIError(400, f"tools[{i}]: server tool {t.get('type', t['name'])!r} is not available here; "
                                f"only client tools with an input_schema")
        out.append({"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                     "parameters": t["input_schema"]}})
    return out or None


def _tool_mode(tools: list[dict] | None, choice: dict | None) -> tuple[list[dict] | None, str, bool]:
    """(tools, "auto" | "required" | "named", parallel) from Anthropic's tool_choice."""
    choice = choice or {}
    kind, parallel = choice.get("type", "auto"), not choice.get("disable_parallel_tool_use", False)
    if kind in ("auto", "none"):
        return tools, "auto", parallel
    if kind not in ("any", "tool"):
        raise APIError(400, f"tool_choice.type: expected auto, any, tool or none, got {kind!r}")
    if not tools:
        raise APIError(400, f"tool_choice: {kind!r} needs tools")
    return (tools, "required", parallel) if kind == "any" else (forced_tool(tools, choice.get("name"),
                                                                            "tool_choice"), "named", parallel)


def _output_schema(config: dict | None) -> tuple[dict | None, dict]:
    """(JSON schema of output_config.format, chat-template variables from output_config.effort)."""
    config = config or {}
    unknown = set(config) - {"format", "effort"}
    if unknown:
        raise APIError(400, f"output_config.{sorted(unknown)[0]}: not supported by this server")
    fmt, schema = config.get("format"), None
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise APIError(400, "output_config.format: expected {\"type\": \"json_schema\", \"schema\": {...}}")
        schema = fmt["schema"]
    return schema, ({"reasoning_effort": config["effort"]} if config.get("effort") else {})


def _edited(req) -> tuple[list[dict], list[dict], list[dict] | None]:
    """(messages after the context-management edits, the applied-edit records, messages before them when an edit
    removed something: the service counts the tokens it cleared)."""
    raw = [{"role": m.role, "content": m.content} for m in req.messages]
    edited, applied = raw, []
    for keep in context_edits(getattr(req, "context_management", None)):
        edited, turns = clear_thinking(edited, keep)
        applied.append({"type": "clear_thinking_20251015", "cleared_thinking_turns": turns,
                        "cleared_input_tokens": 0})
    cleared = any(e["cleared_thinking_turns"] for e in applied)
    return _messages(req.system, edited), applied, (_messages(req.system, raw) if cleared else None)


def messages_input(req: MessagesRequest) -> ChatInput:
    check_fields(req, REFUSED, ACCEPTED)
    params = Params(req.max_tokens, req.temperature, req.top_p, req.top_k,
                    check_stop(req.stop_sequences, "stop_sequences"))
    tools, mode, parallel = _tool_mode(_tools(req.tools, req.tool_choice), req.tool_choice)
    schema, kwargs = _output_schema(req.output_config)
    if schema is not None and mode != "auto":
        raise APIError(400, "output_config.format: cannot be combined with a forced tool_choice")
    if mode != "auto":
        params.constraint = Constraint("json", tool_call_schema(tools, mode, parallel), "tool_choice")
    elif schema is not None:
        params.constraint = Constraint("json", schema, "output_config.format.schema")
    thinking = thinking_config(req.thinking, req.max_tokens)
    params.thinking_budget = thinking.budget
    kwargs["enable_thinking"] = thinking.enabled  # Qwen3's templates read it; others ignore it
    messages, applied, uncleared = _edited(req)
    return ChatInput(messages, tools, params, mode, parallel, kwargs, thinking.enabled, edits=applied,
                     uncleared=uncleared, show_thinking=thinking.shown)


def count_tokens_input(req: CountTokensRequest) -> ChatInput:
    thinking = (req.thinking or {}).get("type") in ("enabled", "adaptive")
    return ChatInput(_edited(req)[0], _tools(req.tools, None), Params(), template_kwargs={"enable_thinking": thinking})


class MessageBuilder:
    def __init__(self, model: str, chat: ChatInput):
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        self.model, self.chat = model, chat
        self.block = "thinking" if chat.thinking else "text"  # the open stream block
        self.index = 0

    def _base(self, content: list, stop_reason, stop_sequence, usage: dict) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}

    def _context_management(self) -> dict:
        """The edits carried out, when the request asked for any (their cleared tokens counted at rendering)."""
        return {"context_management": {"applied_edits": self.chat.edits}} if self.chat.edits else {}

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
        shown = done.reasoning if self.chat.show_thinking else ""
        content = [{"type": "thinking", "thinking": shown, "signature": ""}] if done.reasoning else []
        content += [{"type": "text", "text": done.text}] if done.text or not done.tool_calls else []
        content += [{"type": "tool_use", "id": f"toolu_{c.id[5:]}", "name": c.name, "input": json.loads(c.arguments)}
                    for c in done.tool_calls]
        return {**self._base(content, *self.stop_reason(done), self.usage(done)), **self._context_management()}

    # stream: (event name, data) pairs
    def start_events(self, prompt_tokens: int) -> list[tuple[str, dict]]:
        usage = {"input_tokens": prompt_tokens, "output_tokens": 0}
        return [("message_start", {"type": "message_start", "message": self._base([], None, None, usage)}),
                self._block_start(), ("ping", {"type": "ping"})]

    def _block_start(self) -> tuple[str, dict]:
        block = {"type": "thinking", "thinking": ""} if self.block == "thinking" else {"type": "text", "text": ""}
        return "content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block}

    def _delta(self, delta: dict) -> tuple[str, dict]:
        return "content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}

    def _block_stop(self) -> list[tuple[str, dict]]:
        out = [self._delta({"type": "signature_delta", "signature": ""})] if self.block == "thinking" else []
        return out + [("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def events(self, event: Delta | Done) -> list[tuple[str, dict]]:
        if isinstance(event, Delta):
            if not event.text:
                return []
            if event.kind == "reasoning":
                return [self._delta({"type": "thinking_delta", "thinking": event.text})] if self.chat.show_thinking \
                    else []
            out = []
            if self.block == "thinking":  # the answer begins: the thinking block ends
                out += self._block_stop()
                self.block, self.index = "text", self.index + 1
                out.append(self._block_start())
            return out + [self._delta({"type": "text_delta", "text": event.text})]
        out = self._block_stop()
        for i, c in enumerate(event.tool_calls, start=self.index + 1):
            block = {"type": "tool_use", "id": f"toolu_{c.id[5:]}", "name": c.name, "input": {}}
            out += [("content_block_start", {"type": "content_block_start", "index": i, "content_block": block}),
                    ("content_block_delta", {"type": "content_block_delta", "index": i,
                                             "delta": {"type": "input_json_delta", "partial_json": c.arguments}}),
                    ("content_block_stop", {"type": "content_block_stop", "index": i})]
        reason, seq = self.stop_reason(event)
        usage = self.usage(event)
        out += [("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                                   "usage": usage, **self._context_management()}),
                ("message_stop", {"type": "message_stop"})]
        return out
