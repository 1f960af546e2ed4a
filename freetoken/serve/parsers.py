"""Model output -> reasoning, content and tool calls, as it streams: a reasoning parser (`<think>` blocks, or
gpt-oss Harmony channels) splits the text, a tool format (freetoken/serve/tools.py) holds its calls back from the
content and parses them when the output is complete. Chosen per model family; `--tool-parser` /
`--reasoning-parser` override.

Harmony is parsed from the text decoded with its special tokens (`<|channel|>analysis<|message|>...<|end|>`):
openai-harmony's own parser needs the o200k vocabulary file, which it downloads on first use.
"""

from __future__ import annotations

import re

from freetoken.serve.textstream import _partial_suffix
from freetoken.serve.tools import TOOL_FORMATS, ToolCall, ToolFormat, make_call

Piece = tuple[str, str]  # ("reasoning" | "content", text)

TOOL_PARSERS = (*TOOL_FORMATS, "harmony")
REASONING_PARSERS = ("think", "harmony", "none")
FAMILY_TOOLS = {"gpt_oss": "harmony", "deepseek_v2": "deepseek", "deepseek_v3": "deepseek", "mixtral": "mistral",
                "mistral": "mistral", "glm4_moe": "glm"}  # others: hermes (Qwen, OLMoE, ...)
FAMILY_REASONING = {"qwen3_moe": "think", "qwen3": "think", "deepseek_v3": "think", "glm4_moe": "think",
                    "gpt_oss": "harmony"}  # others: none
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def resolve_parsers(family: str, tool_parser: str = "auto", reasoning_parser: str = "auto") -> tuple[str, str]:
    tools = FAMILY_TOOLS.get(family, "hermes") if tool_parser == "auto" else tool_parser
    reasoning = FAMILY_REASONING.get(family, "none") if reasoning_parser == "auto" else reasoning_parser
    return tools, reasoning


class OutputParser:
    """`<think>` reasoning (when enabled) and one tool format's calls. feed() returns the pieces now safe to emit."""

    close_reasoning = f"\n{THINK_CLOSE}\n\n"  # text that ends the reasoning when its budget is spent

    def __init__(self, tools: ToolFormat | None, think: bool, thinking_open: bool = False):
        self.tools, self.think = tools, think
        self.keep_special = bool(tools and tools.keep_special)
        self.in_reasoning = think and thinking_open  # the prompt ended inside an open <think>
        self.seen_reasoning = self.in_reasoning
        self.buf = ""  # text not yet classified
        self.reasoning = ""
        self.content = ""  # all content text, held tool-call text included
        self._sent = 0  # chars of content emitted

    def feed(self, text: str, final: bool = False) -> list[Piece]:
        self.buf += text
        out: list[Piece] = []
        while self.buf:
            if self.in_reasoning:
                i = self.buf.find(THINK_CLOSE)
                cut = i if i >= 0 else len(self.buf) - (0 if final else _partial_suffix(self.buf, [THINK_CLOSE]))
                self._piece(out, "reasoning", self.buf[:cut])
                self.buf = self.buf[cut + len(THINK_CLOSE):] if i >= 0 else self.buf[cut:]
                self.in_reasoning = i < 0
                if i < 0:
                    break
                continue
            if self.think and not self.seen_reasoning and not self.content:
                head = self.buf.lstrip()
                if head.startswith(THINK_OPEN):
                    self.in_reasoning = self.seen_reasoning = True
                    self.buf = head[len(THINK_OPEN):]
                    continue
                if THINK_OPEN.startswith(head) and not final:
                    break  # could still become <think>
            text, self.buf = self.buf, ""
            if self.seen_reasoning and not self.content:
                text = text.lstrip()  # the blank line after </think>
            self.content += text
            self._release(out, final)
        if final:
            self._release(out, final)
        return out

    def _piece(self, out: list[Piece], kind: str, text: str) -> None:
        if text:
            if kind == "reasoning":
                self.reasoning += text
            out.append((kind, text))

    def _release(self, out: list[Piece], final: bool) -> None:
        markers = self.tools.markers if self.tools else ()
        found = [i for i in (self.content.find(m) for m in markers) if i >= 0]
        end = min(found) if found else len(self.content) - (0 if final else _partial_suffix(self.content, markers))
        if end > self._sent:
            out.append(("content", self.content[self._sent:end]))
            self._sent = end

    def finish(self) -> tuple[list[Piece], list[ToolCall]]:
        """The rest, and the parsed calls (content then excludes them)."""
        out = self.feed("", final=True)
        held = self.content[self._sent:]
        if not held:
            return out, []
        text, calls = self.tools.parse(self.content)
        if calls:
            self.content = text
            return out, calls
        out.append(("content", held))  # not a well-formed call after all: it is text
        self._sent = len(self.content)
        return out, []


_HARMONY_ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")


class HarmonyParser:
    """gpt-oss: messages `<|channel|>NAME [to=functions.F] ...<|message|>BODY<|end|>`; analysis is reasoning,
    final and plain commentary are content, a commentary message to functions.F is a call of F."""

    keep_special = True
    close_reasoning = "<|end|><|start|>assistant<|channel|>final<|message|>"

    @property
    def in_reasoning(self) -> bool:
        return self.kind == "reasoning"

    def __init__(self, tools_enabled: bool):
        self.tools_enabled = tools_enabled
        self.buf = ""
        self.kind: str | None = None  # None: in a header
        self.call_name: str | None = None
        self.body = ""
        self.raw_calls: list[tuple[str, str]] = []
        self.reasoning = self.content = ""
        self.messages = 0

    def feed(self, text: str, final: bool = False) -> list[Piece]:
        self.buf += text
        out: list[Piece] = []
        while self.buf:
            if self.kind is None:
                i = self.buf.find("<|message|>")
                if i < 0:
                    break
                header, self.buf = self.buf[:i], self.buf[i + len("<|message|>"):]
                channel, to = _CHANNEL.search(header), _RECIPIENT.search(header)
                self.call_name = to.group(1) if to and self.tools_enabled else None
                self.kind = "call" if self.call_name else (
                    "reasoning" if channel and channel.group(1) == "analysis" else "content")
                self.body, self.messages = "", self.messages + 1
                continue
            ends = [(i, m) for m in _HARMONY_ENDS if (i := self.buf.find(m)) >= 0]
            if ends:
                i, marker = min(ends)
                self._body(out, self.buf[:i])
                self.buf = self.buf[i + len(marker):]
                self._close()
                continue
            keep = 0 if final else _partial_suffix(self.buf, _HARMONY_ENDS)
            self._body(out, self.buf[:len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep:]
            break
        return out

    def _body(self, out: list[Piece], text: str) -> None:
        if not text:
            return
        self.body += text
        if self.kind == "reasoning":
            self.reasoning += text
        elif self.kind == "content":
            self.content += text
        if self.kind != "call":
            out.append((self.kind, text))

    def _close(self) -> None:
        if self.kind == "call":
            self.raw_calls.append((self.call_name, self.body))
        self.kind = None

    def finish(self) -> tuple[list[Piece], list[ToolCall]]:
        out = self.feed("", final=True)
        if self.kind is not None:
            self._close()  # the stop token (<|call|>, <|return|>) ended the last message
        elif self.buf and not self.messages:  # no Harmony structure at all: plain text
            self.content += self.buf
            out.append(("content", self.buf))
        calls = [make_call(name, body) for name, body in self.raw_calls]
        if any(c is None for c in calls):  # malformed: the call bodies are text
            text = "".join(body for _, body in self.raw_calls)
            self.content += text
            return out + [("content", text)], []
        return out, calls


def output_parser(tool_parser: str, reasoning_parser: str, tools_enabled: bool, thinking_open: bool):
    """A fresh parser for one request."""
    if "harmony" in (tool_parser, reasoning_parser):
        return HarmonyParser(tools_enabled)
    tools = TOOL_FORMATS[tool_parser] if tools_enabled else None
    return OutputParser(tools, reasoning_parser == "think", thinking_open)
