"""Request fields every API shares the handling of: a known field this server does not implement is refused with
a 400 naming it (never silently ignored); an unknown extra field is logged and ignored, as vLLM does; fields
with no effect on the output (user, metadata, ...) are accepted."""

from __future__ import annotations

import logging

from pydantic import BaseModel

from freetoken.serve.errors import APIError

log = logging.getLogger("freetoken.serve")


def check_fields(req: BaseModel, refused: dict[str, str], accepted: frozenset[str]) -> None:
    """refused: field -> why; a refused field set to anything but null / false / [] is a 400 ({} is a setting:
    web_search_options: {} turns search on)."""
    for name, value in (req.model_extra or {}).items():
        if name in refused:
            if value is not None and value is not False and value != []:
                raise APIError(400, f"{name}: not supported by this server ({refused[name]})", name)
        elif name not in accepted:
            log.info("ignoring unknown request field %r", name)


def logit_bias(raw: dict[str, float] | None, param: str = "logit_bias") -> dict[int, float]:
    out = {}
    for key, value in (raw or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise APIError(400, f"{param}: keys must be token ids, got {key!r}", param) from None
        if not -100 <= value <= 100:
            raise APIError(400, f"{param}[{key}]: a bias lies in [-100, 100], got {value}", param)
        out[token] = float(value)
    return out


def forced_tool(tools: list[dict] | None, name: str | None, param: str) -> list[dict]:
    """A named tool choice: the one tool it names, which must be among tools."""
    for t in tools or []:
        if t["function"]["name"] == name:
            return [t]
    raise APIError(400, f"{param}: names tool {name!r}, which is not among the request's tools", param)
