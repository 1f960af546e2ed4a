"""OpenAI Responses API: input items to a ChatInput; the response object and its stream events."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from pydantic import Field

from freetoken.serve.chat import ChatInput, text_of, tool_call
from freetoken.serve.errors import APIError
from freetoken.serve.fields import check_fields
from freetoken.serve.grammar import Constraint
from freetoken.serve.openai_api import ACCEPTED, Lenient, openai_params, openai_tools, response_schema, tool_mode
from freetoken.serve.output import tool_call_schema
from freetoken.serve.service import Delta, Done

REFUSED = {"previous_response_id": "no stored responses; send the whole input", "conversation": "no stored state",
           "background": "no background mode", "prompt": "no stored prompts", "max_tool_calls": "no tool loop here",
           "top_logprobs": "use /v1/chat/completions for logprobs", "audio": "text only"}
# include: extra output to echo (encrypted reasoning, ...); nothing here to include, accepted as such;
# client_metadata: Codex's turn ids, no effect on the output
RESPONSES_ACCEPTED = ACCEPTED | {"include", "truncation", "client_metadata"}


class ResponsesRequest(Lenient):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stop: str | list[str] | None = None
    text: dict[str, Any] | None = None  # {"format": {"type": "json_schema", "schema": ...}}
    reasoning: dict[str, Any] | None = None  # {"effort": ...}: passed to the chat template as reasoning_effort
    seed: int | None = None
    top_k: int | None = Field(None, ge=0)  # vLLM's extension


def _messages(req: ResponsesRequest) -> list[dict]:
    out = [{"role": "system", "content": req.instructions}] if req.instructions else []
    if isinstance(req.input, str):
        return out + [{"role": "user", "content": req.input}]
    for i, item in enumerate(req.input):
        kind = item.get("type", "message")
        where = f"input[{i}]"
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise APIError(400, f"{where}.role: expected user, assistant, system or developer, got {role!r}",
                               f"input.{i}.role")
            try:
                content = text_of(item.get("content"), f"{where}.content")
            except ValueError as e:
                raise APIError(400, str(e), f"input.{i}.content")
            out.append({"role": "system" if role == "developer" else role, "content": content})
        elif kind == "function_call":
            name = item.get("name", "")
            if item.get("namespace"):
                name = f"{item['namespace']}{NAMESPACE_SEP}{name}"
            call = tool_call(name, item.get("arguments", "{}"), item.get("call_id"))
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": output if isinstance(output, str) else json.dumps(output)})
        elif kind == "reasoning":
            continue  # earlier reasoning is not replayed into the prompt
        else:
            raise APIError(400, f"{where}.type {kind!r} is not supported", f"input.{i}.type")
    return out


NAMESPACE_SEP = "."  # a namespace's function f of namespace ns is shown to the model as ns.f


def _function(t: dict, where: str, namespace: str | None = None, note: str = "") -> dict:
    if t.get("type") != "function" or not isinstance(t.get("name"), str):
        kind = t.get("type")
        raise APIError(400, f"{where}: a {kind!r} tool cannot run on this server (function tools only)", where)
    name = t["name"] if namespace is None else f"{namespace}{NAMESPACE_SEP}{t['name']}"
    fn = {"name": name, **{k: t[k] for k in ("description", "parameters") if k in t}}
    if note:
        fn["description"] = f"{note}\n{fn.get('description', '')}".strip()
    return {"type": "function", "function": fn}


def _tools(req: ResponsesRequest) -> list[dict] | None:
    """Responses tools are flat ({type, name, parameters}); the chat templates take the nested chat form. A
    namespace's functions are listed as ns.f; a built-in tool (web_search, file_search, ...) cannot run here and is
    a 400 naming it."""
    if not req.tools:
        return None
    nested = []
    for i, t in enumerate(req.tools):
        where = f"tools[{i}]"
        if t.get("type") == "namespace":
            ns = t.get("name")
            if not isinstance(ns, str) or not ns or not isinstance(t.get("tools"), list):
                raise APIError(400, f"{where}: a namespace tool needs a name and a list of tools", where)
            nested += [_function(f, f"{where}.tools[{j}]", ns, t.get("description", ""))
                       for j, f in enumerate(t["tools"])]
        else:
            nested.append(_function(t, where))
    return openai_tools(nested, req.tool_choice)


def namespaced(name: str, req: ResponsesRequest) -> tuple[str, str | None]:
    """A called tool's (name, namespace) as the request listed it."""
    ns, _, inner = name.partition(NAMESPACE_SEP)
    if inner and any(t.get("type") == "namespace" and t.get("name") == ns for t in req.tools or []):
        return inner, ns
    return name, None


def responses_input(req: ResponsesRequest) -> ChatInput:
    check_fields(req, REFUSED, RESPONSES_ACCEPTED)
    if (req.model_extra or {}).get("truncation") not in (None, "disabled"):
        raise APIError(400, "truncation: only 'disabled' (a prompt too long is an error)", "truncation")
    tools, mode = tool_mode(_tools(req), req.tool_choice)
    parallel = req.parallel_tool_calls is not False
    fmt = (req.text or {}).get("format")
    if fmt is not None and not isinstance(fmt, dict):
        raise APIError(400, f"text.format: expected an object with a type, got {type(fmt).__name__}", "text.format")
    schema = response_schema({"type": fmt.get("type"), "json_schema": fmt} if fmt else None, "text.format")
    if schema is not None and mode != "auto":
        raise APIError(400, "text.format: cannot be combined with a forced tool_choice", "text.format")
    constraint = None if schema is None else Constraint("json", schema, "text.format.schema")
    if mode != "auto":
        constraint = Constraint("json", tool_call_schema(tools, mode, parallel), "tool_choice")
    kwargs = {"reasoning_effort": req.reasoning["effort"]} if (req.reasoning or {}).get("effort") else {}
    params = openai_params(req.max_output_tokens, req.temperature, req.top_p, req.stop, req.seed,
                           constraint=constraint)
    params.top_k = req.top_k
    return ChatInput(_messages(req), tools, params, mode, parallel, kwargs)


class ResponseBuilder:
    """The response object and its stream events; sequence numbers count every event sent."""

    def __init__(self, model: str, req: ResponsesRequest):
        self.id = f"resp_{uuid.uuid4().hex}"
        self.msg_id = f"msg_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.req = req
        self.seq = 0
        self.text = ""

    def _event(self, kind: str, **fields) -> dict:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def response(self, done: Done | None, streamed: bool = False) -> dict:
        """streamed: the message item was opened at the start of the stream, so it is listed even if empty."""
        status = "in_progress" if done is None else ("incomplete" if done.finish == "length" else "completed")
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
               "model": self.model, "output": [] if done is None else self.output(done, streamed),
               "instructions": self.req.instructions, "max_output_tokens": self.req.max_output_tokens,
               "temperature": self.req.temperature, "top_p": self.req.top_p, "tools": self.req.tools or [],
               "tool_choice": self.req.tool_choice or "auto", "parallel_tool_calls": True, "error": None,
               "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
               "usage": None}
        if done is not None:
            out["usage"] = {"input_tokens": done.prompt_tokens, "output_tokens": done.completion_tokens,
                            "total_tokens": done.prompt_tokens + done.completion_tokens,
                            "input_tokens_details": {"cached_tokens": done.cached_tokens},
                            "output_tokens_details": {"reasoning_tokens": 0}}
        return out

    def _message(self, text: str, status: str) -> dict:
        content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
        return {"type": "message", "id": self.msg_id, "status": status, "role": "assistant", "content": content}

    def output(self, done: Done, streamed: bool) -> list[dict]:
        keep = streamed or done.text or not done.tool_calls
        items = [self._message(done.text, "completed")] if keep else []
        if done.reasoning:  # in the final response (streamed deltas carry the answer text only); last when
            # streamed, so the streamed items keep their output_index
            items.insert(len(items) if streamed else 0, {
                "type": "reasoning", "id": f"rs_{self.msg_id[4:]}", "summary": [],
                "content": [{"type": "reasoning_text", "text": done.reasoning}]})
        return items + [{**self._call(c), "arguments": c.arguments, "status": "completed"} for c in done.tool_calls]

    def _call(self, c) -> dict:
        """A function_call item's identity: its name, and its namespace when the function came from one."""
        name, ns = namespaced(c.name, self.req)
        return {"type": "function_call", "id": f"fc_{c.id}", "call_id": c.id, "name": name,
                **({"namespace": ns} if ns else {})}

    # stream
    def start_events(self) -> list[dict]:
        part = {"type": "output_text", "text": "", "annotations": []}
        return [self._event("response.created", response=self.response(None)),
                self._event("response.in_progress", response=self.response(None)),
                self._event("response.output_item.added", output_index=0, item=self._message("", "in_progress")),
                self._event("response.content_part.added", item_id=self.msg_id, output_index=0, content_index=0,
                            part=part)]

    def events(self, event: Delta | Done) -> list[dict]:
        if isinstance(event, Delta):
            if event.kind == "reasoning" or not event.text:
                return []
            self.text += event.text
            return [self._event("response.output_text.delta", item_id=self.msg_id, output_index=0,
                                content_index=0, delta=event.text, logprobs=[])]
        part = {"type": "output_text", "text": event.text, "annotations": []}
        out = [self._event("response.output_text.done", item_id=self.msg_id, output_index=0, content_index=0,
                           text=event.text, logprobs=[]),
               self._event("response.content_part.done", item_id=self.msg_id, output_index=0, content_index=0,
                           part=part),
               self._event("response.output_item.done", output_index=0, item=self._message(event.text, "completed"))]
        for i, c in enumerate(event.tool_calls, start=1):
            item = {**self._call(c), "arguments": "", "status": "in_progress"}
            out += [self._event("response.output_item.added", output_index=i, item=item),
                    self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                                delta=c.arguments),
                    self._event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                name=item["name"], arguments=c.arguments),
                    self._event("response.output_item.done", output_index=i,
                                item={**item, "arguments": c.arguments, "status": "completed"})]
        final = self.response(event, streamed=True)
        # response.completed even when cut by max_output_tokens (status "incomplete" inside says so): the SDKs'
        # stream helpers and agents wait for this event to take the final response
        return out + [self._event("response.completed", response=final)]
