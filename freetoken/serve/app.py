"""The FastAPI app: OpenAI (/v1/chat/completions, /v1/completions, /v1/responses, /v1/models) and Anthropic
(/v1/messages) over one Service, plus /health, /version and /metrics; every error in the calling API's own error
shape, the server unharmed by any request. Parsing, rendering and tokenizing run off the event loop, so /health
answers while a big request is being read or prepared."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from freetoken.serve.anthropic_api import (CountTokensRequest, MessageBuilder, MessagesRequest, count_tokens_input,
                                           messages_input)
from freetoken.serve.anthropic_context import check_betas
from freetoken.serve.completions_api import (Completion, CompletionRequest, completion_input, completion_prompts,
                                             prompts_of)
from freetoken.serve.config import DEFAULT_MAX_BODY_MB, ServeConfig
from freetoken.serve.errors import APIError, render_error, validation_message
from freetoken.serve.middleware import AccessLog, ApiKey, BodyLimit
from freetoken.serve.openai_api import ChatCompletionRequest, chat_input, models_list, samples
from freetoken.serve.openai_output import ChatCompletion, TokenText, best
from freetoken.serve.tokenize_api import DetokenizeRequest, TokenizeRequest, tokenize_input
from freetoken.serve.responses_api import ResponseBuilder, ResponsesRequest, responses_input
from freetoken.serve.service import Done, Service

MAX_JSON_DEPTH = 128  # deeper request JSON is refused (a 100k-deep body must be a 400, not a RecursionError)

log = logging.getLogger("freetoken.serve")


def _sse(data: dict, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _chain(first, rest: AsyncIterator) -> AsyncIterator:
    yield first
    async for item in rest:
        yield item


def json_depth(obj) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            if depth > MAX_JSON_DEPTH:
                break
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


def decode_body(body: bytes, schema: type[BaseModel]):
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}")
    except RecursionError:
        raise APIError(400, f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
    if not isinstance(obj, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(obj).__name__}")
    if json_depth(obj) > MAX_JSON_DEPTH:
        raise APIError(400, f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        return schema.model_validate(obj)
    except ValidationError as e:
        raise APIError(400, *validation_message(e))


def build_app(service: Service, cfg: ServeConfig | None = None) -> FastAPI:
    app = FastAPI(title="freetoken", docs_url=None, redoc_url=None, openapi_url=None)
    model_id = service.backend.model_id
    started = int(time.time())
    max_body_mb = cfg.max_body_mb if cfg else DEFAULT_MAX_BODY_MB
    app.add_middleware(BodyLimit, max_bytes=int(max_body_mb * 2**20))
    key = cfg.resolved_api_key if cfg else None
    if key:
        app.add_middleware(ApiKey, key=key)  # runs before any body is read
    app.add_middleware(AccessLog)  # added last: runs first, so it sees every refusal too

    def error(request: Request, e: APIError):
        request.state.error = e.message  # the access log's reason
        return render_error(request.url.path, e)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return error(request, e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        return error(request, APIError(e.status_code, f"{request.method} {request.url.path}: {e.detail}"))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        log.exception("request failed")
        return error(request, APIError(500, f"internal error: {type(e).__name__}: {e}"))

    async def parse(request: Request, schema: type[BaseModel]):
        req = await asyncio.to_thread(decode_body, await request.body(), schema)
        if req.model != model_id:
            raise APIError(404, f"model {req.model!r} does not exist; this server serves {model_id!r}", "model",
                           "model_not_found")
        return req

    def used(request: Request, done):
        """The access log's tokens, of a Done or a list of them (prompt tokens of each sequence summed)."""
        for d in done if isinstance(done, list) else [done]:
            p, c = getattr(request.state, "usage", (0, 0))
            request.state.usage = (p + d.prompt_tokens, c + d.completion_tokens)
        return done

    def stream(request: Request, events: AsyncIterator, render: Callable, on_error: Callable, head=(), tail=()):
        """SSE from events; render(event) -> list of SSE strings. Errors after the headers become an error event."""

        async def body():
            try:
                for item in head:
                    yield item
                async for event in events:
                    done = event[1] if isinstance(event, tuple) else event
                    if isinstance(done, Done):
                        used(request, done)
                    for item in render(event):
                        yield item
                for item in tail:
                    yield item
            except APIError as e:
                yield on_error(e)
            except Exception as e:  # the stream has begun: report in-band, keep serving
                log.exception("stream failed")
                yield on_error(APIError(500, f"internal error: {type(e).__name__}: {e}"))

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def begin(events: AsyncIterator) -> AsyncIterator:
        """A request's events, its first one already there: queueing and request errors surface here, before
        any byte is sent, so they get a status code."""
        first = await anext(events)
        return _chain(first, events)

    def numbered(total: int, render: Callable) -> Callable:
        """render(index, event, last) for run_many's (index, event) pairs; last: the request's final Done."""
        ended = [0]

        def each(pair):
            index, event = pair
            ended[0] += isinstance(event, Done)
            return render(index, event, ended[0] == total)

        return each

    # OpenAI
    def openai_stream_error(e: APIError) -> str:
        return _sse(json.loads(render_error("/v1", e).body))

    @app.get("/v1/models")
    async def models():
        return models_list(model_id, started)

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        if name != model_id:
            raise APIError(404, f"model {name!r} does not exist; this server serves {model_id!r}", "model",
                           "model_not_found")
        return models_list(model_id, started)["data"][0]

    decode = service.backend.chat.decode_special  # one token's text, for logprobs
    trust_template = bool(cfg and cfg.trust_request_chat_template)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await parse(request, ChatCompletionRequest)
        chat = chat_input(req, trust_template)
        n, best_of = samples(req.n, req.best_of, req.stream)
        echo = chat.messages[-1]["content"] if req.echo and chat.messages[-1]["role"] == "assistant" else ""
        out = ChatCompletion(model_id, TokenText(decode, req.return_tokens_as_token_ids), bool(req.logprobs), echo)
        if not req.stream:
            return out.response(best(used(request, await service.complete_many(chat, None, best_of)), n))
        events = await begin(service.run_many(chat, None, n))
        usage = bool(req.stream_options and req.stream_options.include_usage)
        render = numbered(n, lambda i, ev, last: [_sse(c) for c in out.chunks(i, ev, usage, last)])
        return stream(request, events, render, openai_stream_error,
                      head=[_sse(c) for c in out.first_chunks(n)], tail=["data: [DONE]\n\n"])

    @app.post("/v1/responses")
    async def responses(request: Request):
        req = await parse(request, ResponsesRequest)
        chat = responses_input(req)
        out = ResponseBuilder(model_id, req)
        if not req.stream:
            return out.response(used(request, await service.complete(chat)))
        events = await begin(service.run(chat))
        head = [_sse(e, e["type"]) for e in out.start_events()]
        return stream(request, events, lambda ev: [_sse(e, e["type"]) for e in out.events(ev)],
                      lambda e: _sse({"type": "error", "sequence_number": out.seq, "code": e.code,
                                      "message": e.message, "param": e.param}, "error"), head=head)

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await parse(request, CompletionRequest)
        chat, n, best_of = completion_input(req)
        batch = prompts_of(req)
        for i, given in enumerate(batch):
            if isinstance(given, str) and not req.truncate_prompt_tokens:
                service.check_length(len(given), "prompt")
        given = await asyncio.to_thread(completion_prompts, service, batch, req)
        out = Completion(model_id, req, [(text, p.tokens) for text, p in given], n,
                         TokenText(decode, req.return_tokens_as_token_ids))
        prompts = [p for _, p in given]
        if not req.stream:
            return out.response(used(request, await service.complete_many(chat, prompts, best_of)))
        events = await begin(service.run_many(chat, prompts, n))
        usage = bool(req.stream_options and req.stream_options.include_usage)
        render = numbered(len(prompts) * n, lambda i, ev, last: [_sse(c) for c in out.chunks(i, ev, usage, last)])
        return stream(request, events, render, openai_stream_error,
                      head=[_sse(c) for c in out.first_chunks()], tail=["data: [DONE]\n\n"])

    # Anthropic
    def anthropic_stream_error(e: APIError) -> str:
        return _sse(json.loads(render_error("/v1/messages", e).body), "error")

    @app.post("/v1/messages")
    async def messages(request: Request):
        check_betas(request.headers.get("anthropic-beta"))
        req = await parse(request, MessagesRequest)
        chat = messages_input(req)
        out = MessageBuilder(model_id, chat)
        if not req.stream:
            return out.message(used(request, await service.complete(chat)))
        prompt = await service.prepare(chat)
        events = await begin(service.run(chat, prompt))
        head = [_sse(data, name) for name, data in out.start_events(len(prompt.tokens))]
        return stream(request, events, lambda ev: [_sse(d, n) for n, d in out.events(ev)], anthropic_stream_error,
                      head=head)

    # token counts: what a prompt is on this model (no length check: a count is how a client finds out)
    async def count(chat) -> list[int]:
        return (await asyncio.to_thread(service.render, chat)).tokens

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        check_betas(request.headers.get("anthropic-beta"))
        req = await parse(request, CountTokensRequest)
        return {"input_tokens": len(await count(count_tokens_input(req)))}

    @app.post("/v1/responses/input_tokens")
    async def responses_input_tokens(request: Request):
        req = await parse(request, ResponsesRequest)
        return {"object": "response.input_tokens", "input_tokens": len(await count(responses_input(req)))}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        req = await parse(request, TokenizeRequest)
        if req.messages is None and req.prompt is None:
            raise APIError(400, "prompt: give a prompt or messages", "prompt")
        if req.messages is None:
            tokens = await asyncio.to_thread(service.backend.chat.encode, req.prompt or "", req.add_special_tokens)
        else:
            tokens = await count(tokenize_input(req))
        return {"count": len(tokens), "max_model_len": service.backend.max_context, "tokens": tokens}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        req = await parse(request, DetokenizeRequest)
        vocab = service.backend.vocab_size
        if not all(0 <= t < vocab for t in req.tokens):
            raise APIError(400, f"tokens: token ids must lie in [0, {vocab})", "tokens")
        return {"prompt": await asyncio.to_thread(service.backend.chat.decode, req.tokens)}

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        return service.health()

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root():  # clients probe the base URL before their first request (Claude Code sends HEAD /)
        return {"model": model_id, "endpoints": "/v1/models, /v1/chat/completions, /v1/completions, /v1/responses, "
                                                "/v1/messages, /health, /metrics, /version"}

    @app.get("/version")
    async def version():
        from importlib.metadata import PackageNotFoundError, version as dist_version

        try:
            v = dist_version("freetoken")
        except PackageNotFoundError:
            v = "unknown"
        return {"version": v, "model": model_id, "backend": service.backend.stats().get("backend")}

    @app.get("/metrics")
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(await asyncio.to_thread(service.metrics.render), media_type=CONTENT_TYPE_LATEST)

    return app

