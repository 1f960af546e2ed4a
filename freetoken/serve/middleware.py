"""ASGI layers in front of every route: the API key, then the body limit (checked while the body streams in,
never after reading it all). Their errors come back in the calling API's error shape."""

from __future__ import annotations

import hmac

from freetoken.serve.errors import APIError, render_error

OPEN_PATHS = ("/health",)  # no key needed: load balancers and `ft launch` probe it


class BodyTooLarge(APIError):
    def __init__(self, limit: int):
        super().__init__(413, f"the request body is larger than this server's limit of {limit} bytes "
                              f"(--max-body-mb)", None, "request_too_large")


class ApiKey:
    """Authorization: Bearer KEY (OpenAI clients) or x-api-key: KEY (Anthropic clients)."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        bearer = headers.get(b"authorization", b"")
        given = bearer[7:].strip() if bearer[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
        if given and hmac.compare_digest(given, self.key):
            return await self.app(scope, receive, send)
        message = "invalid API key" if given else "missing API key (Authorization: Bearer or x-api-key)"
        await render_error(scope["path"], APIError(401, message, None, "invalid_api_key"))(scope, receive, send)


class BodyLimit:
    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:  # refused before a byte of it is read
            response = render_error(scope["path"], BodyTooLarge(self.max_bytes))
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
