"""OpenAI Chat Completions and Models: request schema (OpenAI's fields and vLLM's), conversion to a ChatInput.
The response and its SSE chunks: openai_output.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from freetoken.serve.chat import ChatInput, Params, text_of, tool_call
from freetoken.serve.errors import APIError
from freetoken.serve.fields import check_fields, forced_tool, logit_bias
from freetoken.serve.grammar import Constraint
from freetoken.serve.output import tool_call_schema
from freetoken.serve.vllm_fields import VLLMFields, apply_extras, check_stop, constraint_of

# Known Chat Completions fields with no implementation here: a request that sets one gets a 400 naming it
REFUSED = {"audio": "text output only", "prediction": "no speculative decoding",
           "web_search_options": "no built-in web search", "functions": "use tools", "function_call": "use tool_choice",
           "verbosity": "not a model option here", "suffix": "no fill-in-the-middle"}
ACCEPTED = frozenset({"user", "metadata", "service_tier", "prompt_cache_key", "safety_identifier", "store",
                      "request_id", "priority", "mm_processor_kwargs", "cache_salt", "kv_transfer_params"})
MAX_TOP_LOGPROBS = 20
MAX_N = 128


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


class ChatCompletionRequest(Lenient, VLLMFields):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = Field(None, ge=1, le=MAX_N)
    best_of: int | None = Field(None, ge=1, le=MAX_N)  # vLLM: best_of samples, the n most likely returned
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
    reasoning_effort: str | None = None  # passed to the chat template (gpt-oss's reads it)
    modalities: list[str] | None = None
    # vLLM's chat extensions
    chat_template_kwargs: dict[str, Any] | None = None  # extra chat-template variables
    echo: bool = False  # the reply begins with the last message's text when that message is the assistant's
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    documents: list[dict[str, Any]] | None = None  # for templates that render retrieved documents (RAG)
    chat_template: str | None = None  # only with --trust-request-chat-template


def openai_params(max_tokens, temperature, top_p, stop, seed, **extra) -> Params:
    return Params(max_tokens, temperature, top_p, None, check_stop(stop), seed, **extra)


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


def schema_param(fmt: dict | None, param: str = "response_format") -> str:
    """Where a response_format's schema sits, for errors naming a path inside it."""
    return f"{param}.json_schema.schema" if (fmt or {}).get("type") == "json_schema" else param


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


def samples(n: int | None, best_of: int | None, stream: bool) -> tuple[int, int]:
    """(n, best_of): best_of sequences are sampled and the n most likely (by their tokens' summed logprobs)
    returned; best_of > n cannot stream (the best are known only at the end)."""
    n = n or 1
    best = best_of or n
    if best < n:
        raise APIError(400, f"best_of: must be >= n ({n}), got {best}", "best_of")
    if stream and best > n:
        raise APIError(400, "best_of: more samples than n cannot be streamed (the best are known only at the end)",
                       "best_of")
    return n, best


def chat_input(req: ChatCompletionRequest, trust_template: bool = False) -> ChatInput:
    check_fields(req, REFUSED, ACCEPTED)
    if (req.model_extra or {}).get("store"):
        raise APIError(400, "store: completions are not stored by this server", "store")
    if req.modalities not in (None, ["text"]):
        raise APIError(400, f"modalities: text only, got {req.modalities}", "modalities")
    if req.top_logprobs and not req.logprobs:
        raise APIError(400, "top_logprobs: needs logprobs: true", "top_logprobs")
    if req.chat_template is not None and not trust_template:
        raise APIError(400, "chat_template: this server renders with the model's own template (start it with "
                            "--trust-request-chat-template to accept one)", "chat_template")
    if req.continue_final_message and (req.add_generation_prompt or req.messages[-1].role != "assistant"):
        raise APIError(400, "continue_final_message: needs add_generation_prompt: false and a last message of the "
                            "assistant", "continue_final_message")
    n, best = samples(req.n, req.best_of, req.stream)
    max_tokens = req.max_completion_tokens or req.max_tokens
    tools, mode = tool_mode(openai_tools(req.tools, req.tool_choice), req.tool_choice)
    parallel = req.parallel_tool_calls is not False
    constraint = constraint_of(req, response_schema(req.response_format), schema_param(req.response_format))
    if constraint is not None and mode != "auto":
        raise APIError(400, f"{constraint.param}: cannot be combined with a forced tool_choice", constraint.param)
    if mode != "auto":
        constraint = Constraint("json", tool_call_schema(tools, mode, parallel), "tool_choice")
    params = openai_params(max_tokens, req.temperature, req.top_p, req.stop, req.seed,
                           **sampling_fields(req, (req.top_logprobs or 0) if req.logprobs else None),
                           constraint=constraint, track_logprob=best > n)
    apply_extras(req, params)
    kwargs = dict(req.chat_template_kwargs or {})
    if req.reasoning_effort is not None:
        kwargs["reasoning_effort"] = req.reasoning_effort
    if req.documents is not None:
        kwargs["documents"] = req.documents
    return ChatInput(chat_messages(req.messages), tools, params, mode, parallel, kwargs,
                     add_generation_prompt=req.add_generation_prompt,
                     continue_final_message=req.continue_final_message, chat_template=req.chat_template)


def models_list(model_id: str, created: int) -> dict:
    return {"object": "list", "data": [{"id": model_id, "object": "model", "created": created,
                                        "owned_by": "freetoken"}]}
