"""ASGI layers in front of every route: the access log, the API key, then the body limit (checked while the body
streams in, never after reading it all). Their errors come back in the calling API's error shape."""

from __future__ import annotations

import hmac
import logging
import time

from freetoken.serve.errors import APIError, render_error

access = logging.getLogger("freetoken.access")


def guarded(path: str) -> bool:
    """vLLM's rule: the key guards the API (/v1/...) only; /health, /metrics, /version, /tokenize stay open."""
    return path == "/v1" or path.startswith("/v1/")


class AccessLog:
    """One line per request once its response has ended (streams included): client, method, path, status, prompt
    + output tokens, milliseconds; a 4xx at WARNING with its reason, everything else at INFO."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), 0
        state = scope.setdefault("state", {})

        async def logged(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, logged)
        finally:
            client = (scope.get("client") or ("-",))[0]
            usage = state.get("usage")
            tokens = f" tokens {usage[0]}+{usage[1]}" if usage else ""
            line = (f"{client} {scope['method']} {scope['path']} {status or 'disconnected'}{tokens} "
                    f"{(time.perf_counter() - start) * 1e3:.0f}ms")
            if 400 <= status < 500:
                access.warning("%s: %s", line, state.get("error", ""))
            else:
                access.info("%s", line)


def reject(scope, e: APIError):
    """The error response of a request refused before any route ran, its reason kept for the access log."""
    scope.setdefault("state", {})["error"] = e.message
    return render_error(scope["path"], e)


class BodyTooLarge(APIError):
    def __init__(self, limit: int):
        super().__init__(413, f"the request body is larger than this server's limit of {limit} bytes "
                              f"(--max-body-mb)", None, "request_too_large")


class ApiKey:
    """Authorization: Bearer KEY (OpenAI clients) or x-api-key: KEY (Anthropic clients)."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not guarded(scope["path"]):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        bearer = headers.get(b"authorization", b"")
        given = bearer[7:].strip() if bearer[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
        if given and hmac.compare_digest(given, self.key):
            return await self.app(scope, receive, send)
        message = "invalid API key" if given else "missing API key (Authorization: Bearer or x-api-key)"
        await reject(scope, APIError(401, message, None, "invalid_api_key"))(scope, receive, send)


class BodyLimit:
    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:  # refused before a byte of it is read
            response = reject(scope, BodyTooLarge(self.max_bytes))
            response.headers["connection"] = "close"
            return await response(scope, receive, send)
        received = 0

        async def limited():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:  # chunked: raised into the route reading it, rendered as a 413
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited, send)
