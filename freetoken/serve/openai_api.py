"""OpenAI Chat Completions and Models: request schema, conversion to a ChatInput, responses and SSE chunks."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from freetoken.serve.chat import ChatInput, Params, text_of, tool_call
from freetoken.serve.decoding import TokenLogprob
from freetoken.serve.errors import APIError
from freetoken.serve.fields import check_fields, forced_tool, logit_bias
from freetoken.serve.output import tool_call_schema
from freetoken.serve.service import Delta, Done

# Known Chat Completions fields with no implementation here: a request that sets one gets a 400 naming it
REFUSED = {"audio": "text output only", "prediction": "no speculative decoding",
           "web_search_options": "no built-in web search", "functions": "use tools", "function_call": "use tool_choice",
           "verbosity": "not a model option here", "min_p": "top_p and top_k only",
           "repetition_penalty": "use presence_penalty / frequency_penalty", "best_of": "n and best_of must be 1",
           "suffix": "no fill-in-the-middle", "guided_json": "use response_format", "guided_regex": "JSON only",
           "guided_grammar": "JSON only", "guided_choice": "JSON only", "structured_outputs": "use response_format"}
ACCEPTED = frozenset({"user", "metadata", "service_tier", "prompt_cache_key", "safety_identifier", "store"})
MAX_TOP_LOGPROBS = 20


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
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    top_k: int | None = Field(None, ge=0)  # vLLM's extension
    reasoning_effort: str | None = None  # passed to the chat template (gpt-oss's reads it)
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's extension: extra chat-template variables
    modalities: list[str] | None = None


def openai_params(max_tokens, temperature, top_p, stop, seed, **extra) -> Params:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    return Params(max_tokens, temperature, top_p, None, stops, seed, **extra)


def openai_tools(tools: list[dict] | None, tool_choice) -> list[dict] | None:
    if not tools or tool_choice == "none":
        return None
    for i, t in enumerate(tools):
        fn = t.get("function")
        if t.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise APIError(400, f"tools[{i}]: only function tools with a name are supported", f"tools.{i}")
    return tools


def tool_mode(tools: list[dict] | None, choice, param: str = "tool_choice") -> tuple[list[dict] | None, str]:
    """(tools shown to the model, "auto" | "required" | "named") from OpenAI's tool_choice."""
    if choice in (None, "auto", "none") or not tools:
        if choice == "required" or isinstance(choice, dict):
            raise APIError(400, f"{param}: a forced tool choice needs tools", param)
        return tools, "auto"
    if choice == "required":
        return tools, "required"
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function") or {}
        if not isinstance(fn, dict):
            raise APIError(400, f"{param}.function: expected an object with a name, got {type(fn).__name__}", param)
        name = fn.get("name", choice.get("name"))
        return forced_tool(tools, name, param), "named"
    raise APIError(400, f"{param}: expected none, auto, required or a function, got {choice!r}", param)


def response_schema(fmt: dict | None, param: str = "response_format") -> dict | None:
    """The JSON schema a response_format asks for (json_object: any object); None for text."""
    kind = (fmt or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise APIError(400, f"{param}.json_schema.schema: a JSON schema object is required", param)
        return schema
    raise APIError(400, f"{param}.type: expected text, json_object or json_schema, got {kind!r}", param)


def sampling_fields(req, logprobs: int | None) -> dict:
    """The Params fields beyond the basic ones, shared by chat and completions."""
    return dict(logprobs=logprobs, presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0, logit_bias=logit_bias(req.logit_bias))


def assistant_call(call: dict, where: str, param: str) -> dict:
    """One tool call of an assistant message, in template form; its function must be an object."""
    fn = call.get("function", {})
    if not isinstance(fn, dict):
        raise APIError(400, f"{where}.function: expected an object with name and arguments, got "
                            f"{type(fn).__name__}", param)
    return tool_call(fn.get("name", ""), fn.get("arguments", "{}"), call.get("id"))


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
            msg["tool_calls"] = [assistant_call(c, f"messages[{i}].tool_calls[{j}]", f"messages.{i}.tool_calls")
                                 for j, c in enumerate(m.tool_calls)]
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def chat_input(req: ChatCompletionRequest) -> ChatInput:
    check_fields(req, REFUSED, ACCEPTED)
    if req.n not in (None, 1):
        raise APIError(400, f"n: only n=1 is supported, got {req.n}", "n")
    if (req.model_extra or {}).get("store"):
        raise APIError(400, "store: completions are not stored by this server", "store")
    if req.modalities not in (None, ["text"]):
        raise APIError(400, f"modalities: text only, got {req.modalities}", "modalities")
    if req.top_logprobs and not req.logprobs:
        raise APIError(400, "top_logprobs: needs logprobs: true", "top_logprobs")
    max_tokens = req.max_completion_tokens or req.max_tokens
    tools, mode = tool_mode(openai_tools(req.tools, req.tool_choice), req.tool_choice)
    parallel = req.parallel_tool_calls is not False
    schema = response_schema(req.response_format)
    if schema is not None and mode != "auto":
        raise APIError(400, "response_format: cannot be combined with a forced tool_choice", "response_format")
    if mode != "auto":
        schema = tool_call_schema(tools, mode, parallel)
    params = openai_params(max_tokens, req.temperature, req.top_p, req.stop, req.seed,
                           **sampling_fields(req, (req.top_logprobs or 0) if req.logprobs else None),
                           json_schema=schema)
    params.top_k = req.top_k
    kwargs = dict(req.chat_template_kwargs or {})
    if req.reasoning_effort is not None:
        kwargs["reasoning_effort"] = req.reasoning_effort
    return ChatInput(chat_messages(req.messages), tools, params, mode, parallel, kwargs,
                     schema_param="tool_choice" if mode != "auto" else "response_format")


def logprob_json(lp: TokenLogprob, decode) -> dict:
    """OpenAI's form of one token's logprob: token text, its UTF-8 bytes, the top alternatives."""
    def one(token: int, value: float) -> dict:
        text = decode([token])
        return {"token": text, "logprob": value, "bytes": list(text.encode())}

    return {**one(lp.token, lp.logprob), "top_logprobs": [one(t, v) for t, v in lp.top]}


def choice_logprobs(lps: list[TokenLogprob], decode, wanted: bool) -> dict | None:
    return {"content": [logprob_json(lp, decode) for lp in lps]} if wanted else None


def usage(done: Done) -> dict:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens}}


def tool_calls_json(done: Done) -> list[dict]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in done.tool_calls]


class ChatCompletion:
    """Builds the response object and the stream chunks of one completion."""

    def __init__(self, model: str, decode=None, logprobs: bool = False):
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.decode, self.logprobs = decode, logprobs

    def response(self, done: Done) -> dict:
        message = {"role": "assistant", "content": done.text if (done.text or not done.tool_calls) else None}
        if done.reasoning:
            message["reasoning_content"] = done.reasoning
        if done.tool_calls:
            message["tool_calls"] = tool_calls_json(done)
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": done.finish,
                             "logprobs": choice_logprobs(done.logprobs, self.decode, self.logprobs)}],
                "usage": usage(done)}

    def chunk(self, delta: dict, finish: str | None = None, logprobs: dict | None = None) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]}

    def chunks(self, event: Delta | Done, include_usage: bool) -> list[dict]:
        if isinstance(event, Delta):
            key = "reasoning_content" if event.kind == "reasoning" else "content"
            return [self.chunk({key: event.text}, None, choice_logprobs(event.logprobs, self.decode, self.logprobs))]
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
