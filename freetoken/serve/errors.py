"""Request errors, rendered in the error shape of the API the client speaks."""

from __future__ import annotations

from fastapi.responses import JSONResponse

# HTTP status -> Anthropic error type
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                    413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 503: "overloaded_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def openai_error(e: APIError) -> JSONResponse:
    kind = "invalid_request_error" if e.status < 500 else "server_error"
    return JSONResponse({"error": {"message": e.message, "type": kind, "param": e.param, "code": e.code}},
                        status_code=e.status)


def anthropic_error(e: APIError) -> JSONResponse:
    kind = _ANTHROPIC_TYPES.get(e.status, "invalid_request_error" if e.status < 500 else "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": e.message}}, status_code=e.status)


def render_error(path: str, e: APIError) -> JSONResponse:
    return anthropic_error(e) if path.startswith("/v1/messages") else openai_error(e)


def validation_message(exc) -> tuple[str, str | None]:
    """First problem of a pydantic ValidationError as (message, dotted field path)."""
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err.get("loc", ())) or None
    return (f"{field}: {err['msg']}" if field else err["msg"]), field
