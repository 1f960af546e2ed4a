"""The FastAPI app: OpenAI (/v1/chat/completions, /v1/responses, /v1/models) and Anthropic (/v1/messages) over one
Service; every error in the calling API's own error shape, the server unharmed by any request."""

from __future__ import annotations

import json
import logging
import time
from typing import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from freetoken.serve.anthropic_api import (CountTokensRequest, MessageBuilder, MessagesRequest, count_tokens_input,
                                           messages_input)
from freetoken.serve.errors import APIError, render_error, validation_message
from freetoken.serve.openai_api import ChatCompletion, ChatCompletionRequest, chat_input, models_list
from freetoken.serve.responses_api import ResponseBuilder, ResponsesRequest, responses_input
from freetoken.serve.service import Service

log = logging.getLogger("freetoken.serve")


def _sse(data: dict, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _chain(first, rest: AsyncIterator) -> AsyncIterator:
    yield first
    async for item in rest:
        yield item


def build_app(service: Service) -> FastAPI:
    app = FastAPI(title="freetoken", docs_url=None, redoc_url=None, openapi_url=None)
    model_id = service.backend.model_id
    started = int(time.time())

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return render_error(request.url.path, e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        return render_error(request.url.path, APIError(e.status_code, f"{request.method} {request.url.path}: "
                                                                       f"{e.detail}"))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        log.exception("request failed")
        return render_error(request.url.path, APIError(500, f"internal error: {type(e).__name__}: {e}"))

    async def parse(request: Request, schema: type[BaseModel]):
        body = await request.body()
        try:
            obj = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(400, f"the request body is not valid JSON: {e}")
        if not isinstance(obj, dict):
            raise APIError(400, f"the request body must be a JSON object, got {type(obj).__name__}")
        try:
            req = schema.model_validate(obj)
        except ValidationError as e:
            raise APIError(400, *validation_message(e))
        if req.model != model_id:
            raise APIError(404, f"model {req.model!r} does not exist; this server serves {model_id!r}", "model",
                           "model_not_found")
        return req

    def stream(events: AsyncIterator, render: Callable, on_error: Callable, head=(), tail=()):
        """SSE from events; render(event) -> list of SSE strings. Errors after the headers become an error event."""

        async def body():
            try:
                for item in head:
                    yield item
                async for event in events:
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

    async def begin(chat, prompt=None) -> AsyncIterator:
        """A request's events, its first one already there: queueing and request errors surface here, before
        any byte is sent, so they get a status code."""
        events = service.run(chat, prompt)
        first = await anext(events)
        return _chain(first, events)

    # OpenAI
    def openai_stream_error(e: APIError) -> str:
        return _sse(json.loads(render_error("/v1", e).body))

    @app.get("/v1/models")
    async def models():
        return models_list(model_id, started)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await parse(request, ChatCompletionRequest)
        chat = chat_input(req)
        out = ChatCompletion(model_id)
        if not req.stream:
            return out.response(await service.complete(chat))
        events = await begin(chat)
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return stream(events, lambda ev: [_sse(c) for c in out.chunks(ev, usage)], openai_stream_error,
                      head=[_sse(out.first_chunk())], tail=["data: [DONE]\n\n"])

    @app.post("/v1/responses")
    async def responses(request: Request):
        req = await parse(request, ResponsesRequest)
        chat = responses_input(req)
        out = ResponseBuilder(model_id, req)
        if not req.stream:
            return out.response(await service.complete(chat))
        events = await begin(chat)
        head = [_sse(e, e["type"]) for e in out.start_events()]
        return stream(events, lambda ev: [_sse(e, e["type"]) for e in out.events(ev)],
                      lambda e: _sse({"type": "error", "sequence_number": out.seq, "code": e.code,
                                      "message": e.message, "param": e.param}, "error"), head=head)

    # Anthropic
    def anthropic_stream_error(e: APIError) -> str:
        return _sse(json.loads(render_error("/v1/messages", e).body), "error")

    @app.post("/v1/messages")
    async def messages(request: Request):
        req = await parse(request, MessagesRequest)
        chat = messages_input(req)
        out = MessageBuilder(model_id)
        if not req.stream:
            return out.message(await service.complete(chat))
        prompt = service.prompt(chat)
        events = await begin(chat, prompt)
        head = [_sse(data, name) for name, data in out.start_events(len(prompt.tokens))]
        return stream(events, lambda ev: [_sse(d, n) for n, d in out.events(ev)], anthropic_stream_error,
                      head=head)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        req = await parse(request, CountTokensRequest)
        return {"input_tokens": len(service.render(count_tokens_input(req)).tokens)}

    @app.get("/health")
    async def health():
        return service.health()

    return app

