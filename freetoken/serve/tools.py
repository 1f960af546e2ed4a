"""Tool calls in model output, one parser per family's format. Each takes the output from the format's opening
marker on (the service holds that text back from the content stream) and returns (content before the calls, calls);
unless every call in it is well formed, the whole output stays text.

- hermes: Qwen / Hermes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}]` (v3) or `[TOOL_CALLS]name[ARGS]{...}` (v11+)
- deepseek: `<｜tool▁call▁begin｜>function<｜tool▁sep｜>name\\n```json\\n{...}\\n```<｜tool▁call▁end｜>` (V3) or
  `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` (V3.1)
- glm: GLM-4.5 `<tool_call>name\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n</tool_call>`
(gpt-oss Harmony calls are messages on the commentary channel: freetoken/serve/reasoning.py parses them.)
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Callable

TOOL_OPEN = "<tool_call>"
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_GLM = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)
_DS_CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)(?:<｜tool▁call▁end｜>|$)", re.S)
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.S)


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object


def make_call(name, args) -> ToolCall | None:
    """A call from a name and arguments (an object, or JSON text of one); None when malformed."""
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None
    if not isinstance(name, str) or not name or not isinstance(args, dict):
        return None
    return ToolCall(f"call_{uuid.uuid4().hex[:24]}", name, json.dumps(args, ensure_ascii=False))


def _all_or_text(text: str, start: int, calls: list[ToolCall | None]) -> tuple[str, list[ToolCall]]:
    if not calls or any(c is None for c in calls):
        return text, []
    return text[:start].rstrip(), calls


def _json_call(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    return make_call(obj.get("name"), obj.get("arguments", obj.get("parameters", {})))


def parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
    start = text.find(TOOL_OPEN)
    if start < 0:
        return text, []
    return _all_or_text(text, start, [_json_call(b) for b in _HERMES.findall(text[start:])])


def _mistral_call(part: str) -> ToolCall | None:
    if "[ARGS]" not in part:
        return None
    name, args = part.split("[ARGS]", 1)
    return make_call(name.strip(), args)


def parse_mistral(text: str) -> tuple[str, list[ToolCall]]:
    start = text.find("[TOOL_CALLS]")
    if start < 0:
        return text, []
    body = text[start:]
    if "[ARGS]" in body:  # name[ARGS]{...} per call
        parts = [p for p in body.split("[TOOL_CALLS]") if p.strip()]
        return _all_or_text(text, start, [_mistral_call(p) for p in parts])
    try:
        items = json.loads(body[len("[TOOL_CALLS]"):])
    except json.JSONDecodeError:
        return text, []
    items = items if isinstance(items, list) else [items]
    return _all_or_text(text, start, [make_call(i.get("name"), i.get("arguments", {})) if isinstance(i, dict)
                                      else None for i in items])


def _deepseek_call(block: str) -> ToolCall | None:
    if "<｜tool▁sep｜>" not in block:
        return None
    head, rest = block.split("<｜tool▁sep｜>", 1)
    if head.strip() == "function" and "\n" in rest:  # V3: type, then the name and a fenced JSON body
        name, rest = rest.split("\n", 1)
        fenced = _FENCE.match(rest)
        return make_call(name.strip(), fenced.group(1) if fenced else rest)
    return make_call(head.strip(), rest)


def parse_deepseek(text: str) -> tuple[str, list[ToolCall]]:
    starts = [i for i in (text.find("<｜tool▁calls▁begin｜>"), text.find("<｜tool▁call▁begin｜>")) if i >= 0]
    if not starts:
        return text, []
    start = min(starts)
    return _all_or_text(text, start, [_deepseek_call(b) for b in _DS_CALL.findall(text[start:])])


def _glm_value(raw: str):
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _glm_call(body: str) -> ToolCall | None:
    name = body.split("<arg_key>", 1)[0].strip()
    return make_call(name, {k.strip(): _glm_value(v.strip()) for k, v in _GLM_ARG.findall(body)})


def parse_glm(text: str) -> tuple[str, list[ToolCall]]:
    start = text.find(TOOL_OPEN)
    if start < 0:
        return text, []
    return _all_or_text(text, start, [_glm_call(b) for b in _GLM.findall(text[start:])])


@dataclass(frozen=True, slots=True)
class ToolFormat:
    markers: tuple[str, ...]  # text from the first of these on is held back and parsed at the end
    parse: Callable[[str], tuple[str, list[ToolCall]]]
    keep_special: bool = False  # its markers are special tokens: decode the output with them


TOOL_FORMATS = {
    "hermes": ToolFormat((TOOL_OPEN,), parse_hermes),
    "mistral": ToolFormat(("[TOOL_CALLS]",), parse_mistral, keep_special=True),
    "deepseek": ToolFormat(("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"), parse_deepseek, keep_special=True),
    "glm": ToolFormat((TOOL_OPEN,), parse_glm),
}

parse_tool_calls = parse_hermes  # the default format
