"""OpenAI Chat Completions and Models: request schema, conversion to a ChatInput, responses and SSE chunks."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from freetoken.serve.chat import ChatInput, Params, text_of, tool_call
from freetoken.serve.errors import APIError
from freetoken.serve.service import Delta, Done


class Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")  # fields this server ignores are accepted, as OpenAI's own server does


class ChatMessage(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class StreamOptions(Lenient):
    include_usage: bool = False


class ChatCompletionRequest(Lenient):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None


def openai_params(max_tokens, temperature, top_p, stop, seed) -> Params:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    return Params(max_tokens, 1.0 if temperature is None else temperature, 1.0 if top_p is None else top_p, 0,
                  stops, seed)


def openai_tools(tools: list[dict] | None, tool_choice) -> list[dict] | None:
    if not tools or tool_choice == "none":
        return None
    for i, t in enumerate(tools):
        if t.get("type") != "function" or not isinstance(t.get("function", {}).get("name"), str):
            raise APIError(400, f"tools[{i}]: only function tools with a name are supported", f"tools.{i}")
    return tools


def chat_messages(messages: list[ChatMessage]) -> list[dict]:
    out = []
    for i, m in enumerate(messages):
        try:
            content = text_of(m.content, f"messages[{i}].content")
        except ValueError as e:
            raise APIError(400, str(e), f"messages.{i}.content")
        msg = {"role": "system" if m.role == "developer" else ("tool" if m.role == "function" else m.role),
               "content": content}
        if m.tool_calls:
            msg["tool_calls"] = [tool_call(c.get("function", {}).get("name", ""),
                                           c.get("function", {}).get("arguments", "{}"), c.get("id"))
                                 for c in m.tool_calls]
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def chat_input(req: ChatCompletionRequest) -> ChatInput:
    if req.n not in (None, 1):
        raise APIError(400, f"n: only n=1 is supported, got {req.n}", "n")
    max_tokens = req.max_completion_tokens or req.max_tokens
    return ChatInput(chat_messages(req.messages), openai_tools(req.tools, req.tool_choice),
                     openai_params(max_tokens, req.temperature, req.top_p, req.stop, req.seed))


def usage(done: Done) -> dict:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens}}


def tool_calls_json(done: Done) -> list[dict]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in done.tool_calls]


class ChatCompletion:
    """Builds the response object and the stream chunks of one completion."""

    def __init__(self, model: str):
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def response(self, done: Done) -> dict:
        message = {"role": "assistant", "content": done.text if (done.text or not done.tool_calls) else None}
        if done.tool_calls:
            message["tool_calls"] = tool_calls_json(done)
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": done.finish, "logprobs": None}],
                "usage": usage(done)}

    def chunk(self, delta: dict, finish: str | None = None) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    def chunks(self, event: Delta | Done, include_usage: bool) -> list[dict]:
        if isinstance(event, Delta):
            return [self.chunk({"content": event.text})]
        out = []
        if event.tool_calls:
            out.append(self.chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(tool_calls_json(event))]}))
        out.append(self.chunk({}, event.finish))
        if include_usage:
            out.append({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                        "model": self.model, "choices": [], "usage": usage(event)})
        return out

    def first_chunk(self) -> dict:
        return self.chunk({"role": "assistant", "content": ""})


def models_list(model_id: str, created: int) -> dict:
    return {"object": "list", "data": [{"id": model_id, "object": "model", "created": created,
                                        "owned_by": "freetoken"}]}
