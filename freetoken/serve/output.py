"""One request's sampled tokens -> text deltas (content or reasoning, each with the logprobs of its tokens) and
the final text, reasoning and tool calls: the stop-string stream, then the family's reasoning / tool-call parser;
under a forced tool choice the grammar-constrained JSON output becomes the calls."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from freetoken.serve.chat import ChatInput
from freetoken.serve.decoding import Decoder, TokenLogprob
from freetoken.serve.parsers import OutputParser, THINK_CLOSE, THINK_OPEN, output_parser
from freetoken.serve.textstream import TextStream
from freetoken.serve.tools import ToolCall, make_call


@dataclass(slots=True)
class Delta:
    text: str
    kind: str = "content"  # "content" | "reasoning"
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of the tokens since the previous delta


def tool_call_schema(tools: list[dict], choice: str, parallel: bool) -> dict:
    """The JSON a forced tool choice must produce: "named" the arguments of tools[0]; "required" a list of
    {"name", "parameters"} calls of any tool (one when not parallel), as vLLM constrains it."""
    params = lambda t: t["function"].get("parameters") or {"type": "object"}  # noqa: E731
    if choice == "named":
        return params(tools[0])
    call = {"anyOf": [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                                        "parameters": params(t)},
                       "required": ["name", "parameters"], "additionalProperties": False} for t in tools]}
    return {"type": "array", "items": call, "minItems": 1, **({} if parallel else {"maxItems": 1})}


def forced_calls(chat: ChatInput, text: str) -> list[ToolCall]:
    """The calls in a forced tool choice's JSON output; [] when it is not complete (cut by max_tokens)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return []
    if chat.tool_choice == "named":
        call = make_call(chat.tools[0]["function"]["name"], obj)
        return [call] if call else []
    calls = [make_call(c.get("name"), c.get("parameters")) for c in obj if isinstance(c, dict)]
    return calls if calls and all(calls) else []


class RequestOutput:
    def __init__(self, chat: ChatInput, chat_tokenizer, prompt_tokens: list[int], parsers: tuple[str, str],
                 decoder: Decoder | None = None, stops=None):
        """stops: the request's stop strings as a StopAutomaton built off the event loop (None: built here)."""
        self.chat, self.chat_tokenizer, self.decoder = chat, chat_tokenizer, decoder
        self.reasoning_tokens = 0
        self.forced = bool(chat.tools) and chat.tool_choice != "auto"
        tool_parser, reasoning = parsers
        if self.forced or chat.params.constraint is not None:  # the grammar writes the output from its first token
            self.parser = OutputParser(None, think=False)
        else:
            tail = chat_tokenizer.decode_special(prompt_tokens[-16:]) if reasoning == "think" else ""
            thinking_open = tail.rfind(THINK_OPEN) > tail.rfind(THINK_CLOSE)
            self.parser = output_parser(tool_parser, reasoning, bool(chat.tools), thinking_open)
        p = chat.params
        special = self.parser.keep_special or not p.skip_special_tokens
        decode = chat_tokenizer.decode_special if special else chat_tokenizer.decode
        self.stream = TextStream(decode, p.stop if stops is None else stops, include_stop=p.include_stop_str_in_output,
                                 armed=not p.min_tokens)
        self.tokens = 0
        self.logprobs: list[TokenLogprob] = []
        self._pending: list[TokenLogprob] = []
        self.calls: list[ToolCall] = []

    def push(self, token: int, logprob: TokenLogprob | None) -> list[Delta]:
        self.tokens += 1
        if self.tokens > self.chat.params.min_tokens:
            self.stream.arm()  # stop strings count in the text after the first min_tokens tokens
        if logprob is not None:
            self.logprobs.append(logprob)
            self._pending.append(logprob)
        deltas = self._deltas(self.parser.feed(self.stream.push(token)))
        if self.parser.in_reasoning:
            self.reasoning_tokens += 1
            if self.reasoning_tokens == self.chat.params.thinking_budget and self.decoder is not None:
                self.decoder.forced += self.chat_tokenizer.encode(self.parser.close_reasoning)
        return deltas

    @property
    def stopped(self) -> bool:
        """A stop string ended the text."""
        return self.stream.stop is not None

    def finish(self) -> list[Delta]:
        pieces = self.parser.feed(self.stream.finish())
        rest, calls = self.parser.finish()
        pieces += rest
        if self.forced:
            self.calls = forced_calls(self.chat, self.parser.content)
            if self.calls:
                self.parser.content = ""
        else:
            self.calls = calls if self.chat.parallel_tool_calls else calls[:1]
        out = self._deltas(pieces)
        if self.forced and not self.calls and self.parser.content:  # incomplete JSON: it is text after all
            out.append(Delta(self.parser.content, "content", self._pending))
            self._pending = []
        if self._pending:  # tokens whose text was held back (tool calls) or empty
            out.append(Delta("", "content", self._pending))
            self._pending = []
        return out

    def _deltas(self, pieces) -> list[Delta]:
        out = []
        for kind, text in pieces:
            if (kind == "reasoning" and not self.chat.thinking) or (kind == "content" and self.forced):
                continue
            out.append(Delta(text, kind, self._pending))
            self._pending = []
        return out

    @property
    def text(self) -> str:
        return self.parser.content

    @property
    def reasoning(self) -> str:
        return self.parser.reasoning if self.chat.thinking else ""
