"""Tool calls in model output: the Hermes / Qwen form `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
which the chat templates of those families ask for when `tools` are given."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

TOOL_OPEN = "<tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(text before the first call, calls). Unless every block is a JSON object with a name and object arguments,
    the whole output stays text."""
    start = text.find(TOOL_OPEN)
    if start < 0:
        return text, []
    calls = []
    for body in _BLOCK.findall(text[start:]):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return text, []
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return text, []
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return text, []
        if not isinstance(args, dict):
            return text, []
        calls.append(ToolCall(f"call_{uuid.uuid4().hex[:24]}", obj["name"], json.dumps(args, ensure_ascii=False)))
    return text[:start].rstrip(), calls
