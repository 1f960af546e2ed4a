"""Chat prompts: the three APIs' messages in one form (the HF chat-template form), rendered to token ids with
anchors at message boundaries for the prefix cache."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

# Used when a model ships no chat template: ChatML, as Qwen uses; tools listed in the system turn (Hermes style).
FALLBACK_TEMPLATE = (  # HF renders with trim_blocks: a newline right after a block tag is dropped, hence {{ nl }}
    "{% set nl = '\\n' %}"
    "{% if tools %}<|im_start|>system{{ nl }}"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{{ nl }}{{ nl }}{% endif %}"
    "You may call functions. Signatures:{{ nl }}{% for t in tools %}{{ t | tojson }}{{ nl }}{% endfor %}"
    "Reply with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call> to call one.<|im_end|>{{ nl }}"
    "{% elif messages[0].role == 'system' %}<|im_start|>system{{ nl }}{{ messages[0].content }}<|im_end|>{{ nl }}"
    "{% endif %}"
    "{% for m in messages %}{% if m.role != 'system' or not loop.first %}"
    "<|im_start|>{{ m.role }}{{ nl }}{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}{{ nl }}<tool_call>{{ nl }}"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}{{ nl }}</tool_call>{% endfor %}"
    "<|im_end|>{{ nl }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ nl }}{% endif %}"
)
ANCHOR_LOOKBACK = 16  # message boundaries marked per request; earlier ones were marked by earlier turns


@dataclass(frozen=True, slots=True)
class Prompt:
    tokens: list[int]
    anchors: list[int]  # token offsets that end a message


@dataclass(slots=True)
class Params:
    """Sampling and stopping, API-neutral (vLLM's fields beside OpenAI's). max_tokens None: up to the context length;
    temperature / top_p / top_k None: the model's generation_config.json default (else 1.0 / 1.0 / 0)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: int | None = None  # report the sampled token's logprob and this many top alternatives
    presence_penalty: float = 0.0  # OpenAI's: minus this once a token has appeared in the output
    frequency_penalty: float = 0.0  # minus this per earlier occurrence in the output
    logit_bias: dict[int, float] = field(default_factory=dict)
    constraint: Any = None  # grammar.Constraint: json schema, regex, choice or EBNF grammar the output must keep
    prompt_logprobs: int | None = None  # logprobs of the prompt tokens too, with this many alternatives each
    thinking_budget: int | None = None  # reasoning tokens after which the reasoning is closed (Anthropic's)
    min_p: float | None = None  # drop tokens less likely than min_p x the most likely one (after temperature)
    repetition_penalty: float | None = None  # HF / vLLM: prompt and output tokens' logits divided (> 0) or multiplied
    # (min_p, repetition_penalty None: generation_config.json's, else 0 / 1, as vLLM takes them)
    min_tokens: int = 0  # no stop token (nor stop string) before this many output tokens
    ignore_eos: bool = False  # the model's end-of-sequence tokens do not stop it
    stop_token_ids: list[int] = field(default_factory=list)  # more tokens that stop it
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    allowed_token_ids: list[int] | None = None  # only these may be sampled
    bad_words: list[str] = field(default_factory=list)  # never produced (as a whole), at any position
    truncate_prompt_tokens: int | None = None  # keep only the last k prompt tokens
    track_logprob: bool = False  # sum the chosen tokens' logprobs (best_of picks by it)


@dataclass(slots=True)
class ChatInput:
    messages: list[dict]  # [{"role", "content": str, "tool_calls"?: [...], "tool_call_id"?}]
    tools: list[dict] | None  # OpenAI function form: [{"type": "function", "function": {...}}]
    params: Params
    tool_choice: str = "auto"  # "auto" | "required" (some call) | "named" (a call of tools[0], the one left)
    parallel_tool_calls: bool = True  # False: at most one call
    template_kwargs: dict = field(default_factory=dict)  # extra chat-template variables (enable_thinking, ...)
    thinking: bool = True  # False: reasoning is not returned (Anthropic without `thinking`)
    edits: list[dict] = field(default_factory=list)  # Anthropic context-management edits applied (their records)
    uncleared: list[dict] | None = None  # the messages before those edits, when they removed something
    show_thinking: bool = True  # False: reasoning is returned as empty blocks (Anthropic display "omitted")
    add_generation_prompt: bool = True  # the template opens the assistant's turn
    continue_final_message: bool = False  # the last (assistant) message is continued, not closed
    chat_template: str | None = None  # a request's own template (vLLM's chat_template, when the server trusts it)


def text_of(content: Any, where: str) -> str:
    """Message content as text: a string, or a list of text parts (OpenAI, Anthropic and Responses part types).
    A part of another shape is a ValueError naming it (`where[i]`), the caller's 400."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where}: expected a string or a list of content parts, got {type(content).__name__}")
    parts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            raise ValueError(f"{where}[{i}]: a content part is an object with a type, got {type(part).__name__}")
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text"):
            parts.append(part_text(part, "text", f"{where}[{i}]"))
        elif kind in ("refusal",):
            parts.append(part_text(part, "refusal", f"{where}[{i}]"))
        else:
            raise ValueError(f"{where}[{i}]: content part type {kind!r} is not supported (text only)")
    return "".join(parts)


def part_text(part: dict, key: str, where: str) -> str:
    """part[key], which must be a string (absent: empty)."""
    text = part.get(key, "")
    if not isinstance(text, str):
        raise ValueError(f"{where}.{key}: expected a string, got {type(text).__name__}")
    return text


def tool_call(name: str, arguments: Any, call_id: str | None = None) -> dict:
    """An assistant tool call in template form; arguments as an object where they parse as one."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def raw_decoder(tokenizer):
    """The tokenizers library's own decode where transformers' wrapper adds nothing to it (a fast tokenizer whose
    class keeps the wrapper's decode and _decode, no clean-up of spaces): the wrapper's argument conversion cost
    3.0 us against its 0.8 us, and the server decodes twice per token. None: use the wrapper."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    cls = type(tokenizer)
    if (not isinstance(tokenizer, TokenizersBackend) or cls._decode is not TokenizersBackend._decode
            or cls.decode is not PreTrainedTokenizerBase.decode or tokenizer.clean_up_tokenization_spaces):
        return None
    return tokenizer._tokenizer.decode


class ChatTokenizer:
    """A HF tokenizer plus the model's chat template (or the ChatML fallback)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self._raw = raw_decoder(tokenizer)
        self.template = getattr(tokenizer, "chat_template", None) or FALLBACK_TEMPLATE
        if hasattr(tokenizer, "model_max_length"):  # the server checks prompts against its served context; the
            tokenizer.model_max_length = 2**62  # tokenizer's own limit would only make transformers warn

    def render_text(self, messages: Sequence[dict], tools: list[dict] | None, add_generation_prompt: bool,
                    continue_final_message: bool = False, chat_template: str | None = None,
                    **template_kwargs) -> str:
        return self.tok.apply_chat_template(list(messages), tools=tools or None,
                                            chat_template=chat_template or self.template,
                                            add_generation_prompt=add_generation_prompt,
                                            continue_final_message=continue_final_message, tokenize=False,
                                            **template_kwargs)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int]) -> str:
        if self._raw is not None:
            return self._raw(list(ids), skip_special_tokens=True)
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def decode_special(self, ids: Sequence[int]) -> str:
        """With special tokens: the markers of Harmony channels and some tool-call formats are special tokens."""
        if self._raw is not None:
            return self._raw(list(ids), skip_special_tokens=False)
        return self.tok.decode(list(ids), skip_special_tokens=False)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """Most characters one token decodes to: a prompt of more than context x this many characters cannot fit,
        known before any tokenizing (vocabulary strings are at least as long as the text they decode to)."""
        return max(1, max(len(t) for t in self.tok.get_vocab()))

    def placed(self, messages: Sequence[dict], tools: list[dict] | None, **template_kwargs) -> Sequence[dict]:
        """The messages as the template can render them: system messages after the first message stay in place
        when the template renders their text there, else they are merged into one leading system message."""
        late = [m for m in messages[1:] if m.get("role") == "system"]
        if not late:
            return messages
        try:
            text = self.render_text(messages, tools, False, **template_kwargs)
            if all((m.get("content") or "") in text for m in late):
                return messages
        except Exception:  # a template that refuses a system message after the first (jinja raise_exception)
            pass
        return merge_system(messages)

    def render(self, messages: Sequence[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True,
               continue_final_message: bool = False, chat_template: str | None = None, **template_kwargs) -> Prompt:
        template_kwargs["chat_template"] = chat_template
        messages = self.placed(messages, tools, **template_kwargs)
        text = self.render_text(messages, tools, add_generation_prompt and not continue_final_message,
                                continue_final_message, **template_kwargs)
        ids, offsets = self._encode_with_offsets(text)
        ends = []  # char offsets where a message ends, for the last ANCHOR_LOOKBACK messages
        for n in range(max(1, len(messages) - ANCHOR_LOOKBACK), len(messages) + 1):
            prefix = self.render_text(messages[:n], tools, add_generation_prompt=False, **template_kwargs)
            if text.startswith(prefix):
                ends.append(len(prefix))
        return Prompt(ids, _token_boundaries(offsets, ends))

    def _encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]] | None]:
        if getattr(self.tok, "is_fast", False):
            enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
            return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
        return self.encode(text), None


def merge_system(messages: Sequence[dict]) -> list[dict]:
    """Every system message's text in one leading system message (in order, blank-line separated)."""
    systems = [m.get("content") or "" for m in messages if m.get("role") == "system"]
    rest = [m for m in messages if m.get("role") != "system"]
    return [{"role": "system", "content": "\n\n".join(systems)}, *rest] if systems else rest


def _token_boundaries(offsets: list[tuple[int, int]] | None, char_ends: list[int]) -> list[int]:
    """Token counts whose text ends exactly at one of char_ends (a boundary inside a token is no anchor)."""
    if offsets is None:
        return []
    ends = {end: i + 1 for i, (_, end) in enumerate(offsets)}
    return sorted({ends[c] for c in char_ends if c in ends})
