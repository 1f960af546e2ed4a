"""Importers: other public routing-log formats -> RoutingTrace. One module per format; the format is read from the
file when not given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from freetoken.trace.format import RoutingTrace, TraceError, trace_file
from freetoken.trace.importers.deepseek_npz import import_deepseek_npz
from freetoken.trace.importers.granite_json import import_granite_json
from freetoken.trace.importers.mixtral_jsonl import import_mixtral_jsonl
from freetoken.trace.importers.qwen_routes import import_qwen_routes

IMPORTERS: dict[str, Callable[..., RoutingTrace]] = {
    "mixtral_jsonl": import_mixtral_jsonl,
    "granite_json": import_granite_json,
    "qwen_routes": import_qwen_routes,
    "deepseek_npz": import_deepseek_npz,
}
_PEEK = 1 << 20  # bytes read to recognise a text format


def detect_format(path: str | Path) -> str:
    """The importer name for a file, from its content; TraceError saying why when no format fits."""
    path = trace_file(path)
    valid = ", ".join(IMPORTERS)
    try:
        with open(path, "rb") as f:
            head = f.read(_PEEK)
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror})") from None
    if head.startswith(b"PK\x03\x04"):
        return "deepseek_npz"
    if len(head) >= 8 and head[8:9] == b"{" and b'"format_version"' in head[:_PEEK]:
        raise TraceError(f"{path}: already a freetoken trace (safetensors); nothing to import")
    first = head.split(b"\n", 1)[0].strip()
    try:
        obj = json.loads(first)
    except (json.JSONDecodeError, UnicodeDecodeError):
        obj = None
    if isinstance(obj, dict):
        if obj.get("type") in ("meta", "route"):
            return "qwen_routes"
        if "problem_id" in obj:
            return "mixtral_jsonl"
        if "prompts" in obj:
            return "granite_json"
    elif head.lstrip().startswith(b"{") and b'"prompts"' in head:  # a pretty-printed Granite dump
        return "granite_json"
    raise TraceError(f"{path}: cannot tell the routing-log format from its content; `ft trace import {path} OUT "
                     f"--format FMT` reads it when told the format, one of: {valid}")


def routing_logs(folder: str | Path) -> list[Path]:
    """Every file under `folder` (sorted) that an importer reads, by its content: a folder of real traces as
    shipped, minus the files beside them that are no trace (counts, READMEs). Empty when the folder is absent."""
    folder = Path(folder)
    found = []
    for path in sorted(folder.rglob("*")) if folder.is_dir() else ():
        try:
            if path.is_file() and detect_format(path):
                found.append(path)
        except TraceError:
            pass
    return found


def read_any(path: str | Path) -> RoutingTrace:
    """A saved trace (.safetensors), or any routing log an importer reads (its format told by its content)."""
    from freetoken.trace import load

    return load(path) if str(path).endswith(".safetensors") else import_trace(path)


def import_trace(path: str | Path, fmt: str | None = None, *, model: str | None = None,
                 **options) -> RoutingTrace:
    """Read a routing log; options go to the format's importer (e.g. incomplete='error' for mixtral_jsonl)."""
    import inspect

    if fmt is None:
        fmt = detect_format(path)  # (which checks the path with trace_file first)
    else:
        trace_file(path)
    try:
        fn = IMPORTERS[fmt]
    except KeyError:
        raise ValueError(f"format: unknown {fmt!r}; valid: {', '.join(IMPORTERS)}") from None
    accepted = [p for p in inspect.signature(fn).parameters if p != "path"]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"format {fmt!r} takes no option {', '.join(unknown)}; it takes: "
                         f"{', '.join(accepted) or 'none'}")
    trace = fn(path, **options)
    if model:
        trace.model = model
    return trace


__all__ = ["IMPORTERS", "detect_format", "import_trace", "read_any"]
