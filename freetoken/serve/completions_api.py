"""OpenAI (legacy) Completions, what evaluation harnesses call: a prompt as text or token ids, echo, and logprobs
in the legacy form (tokens, token_logprobs, top_logprobs, text_offset), of the prompt too when echoed."""

from __future__ import annotations

import time
import uuid

from pydantic import Field

from freetoken.serve.chat import ChatInput
from freetoken.serve.decoding import TokenLogprob
from freetoken.serve.errors import APIError
from freetoken.serve.fields import check_fields
from freetoken.serve.openai_api import (ACCEPTED, MAX_TOP_LOGPROBS, REFUSED, Lenient, StreamOptions, openai_params,
                                        sampling_fields)
from freetoken.serve.service import Delta, Done


class CompletionRequest(Lenient):
    model: str
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)  # OpenAI's default; 0 with echo: the prompt's logprobs only
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    n: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None


def prompt_of(req: CompletionRequest) -> str | list[int]:
    """The one prompt: text or token ids (a batch of several is refused)."""
    p = req.prompt
    if isinstance(p, list) and p and isinstance(p[0], (str, list)):
        if len(p) != 1:
            raise APIError(400, f"prompt: one prompt per request, got {len(p)}", "prompt")
        p = p[0]
    if not p:
        raise APIError(400, "prompt: must not be empty", "prompt")
    return p


def completion_input(req: CompletionRequest) -> ChatInput:
    check_fields(req, {k: v for k, v in REFUSED.items() if k != "best_of"}, ACCEPTED | {"best_of"})
    if req.n not in (None, 1) or (req.model_extra or {}).get("best_of") not in (None, 1):
        raise APIError(400, "n: only n=1 (and best_of=1) is supported", "n")
    if req.stream and req.echo and req.logprobs is not None:
        raise APIError(400, "echo: the prompt's logprobs are not streamed; use stream: false", "echo")
    if req.max_tokens == 0 and not req.echo:
        raise APIError(400, "max_tokens: 0 only with echo (the prompt's logprobs)", "max_tokens")
    params = openai_params(req.max_tokens, req.temperature, req.top_p, req.stop, req.seed,
                           **sampling_fields(req, req.logprobs), prompt_logprobs=req.echo and req.logprobs is not None)
    params.top_k = req.top_k
    return ChatInput([], None, params)


def legacy_logprobs(lps: list[TokenLogprob | None], ids: list[int], decode, offset: int) -> dict:
    """{tokens, token_logprobs, top_logprobs, text_offset}; lps[i] None (the first prompt token) has no logprob."""
    tokens = [decode([t]) for t in ids]
    offsets, at = [], offset
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return {"tokens": tokens, "token_logprobs": [None if lp is None else lp.logprob for lp in lps],
            "top_logprobs": [None if lp is None else {decode([t]): v for t, v in lp.top} for lp in lps],
            "text_offset": offsets}


class Completion:
    def __init__(self, model: str, req: CompletionRequest, prompt_text: str, prompt_ids: list[int], decode):
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model, self.req, self.decode = model, req, decode
        self.prompt_text, self.prompt_ids = prompt_text, prompt_ids
        self.offset = len(prompt_text) if req.echo else 0  # chars before the generated text

    def _obj(self, choice: dict, usage: dict | None = None) -> dict:
        out = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
               "choices": [choice]}
        return {**out, "usage": usage} if usage is not None else out

    @staticmethod
    def usage(done: Done) -> dict:
        return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
                "total_tokens": done.prompt_tokens + done.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": done.cached_tokens}}

    def _logprobs(self, lps: list, ids: list[int], offset: int) -> dict | None:
        return None if self.req.logprobs is None else legacy_logprobs(lps, ids, self.decode, offset)

    def response(self, done: Done) -> dict:
        lps, ids = list(done.logprobs), [lp.token for lp in done.logprobs]
        if self.req.echo and done.prompt_logprobs is not None:
            lps, ids = done.prompt_logprobs + lps, self.prompt_ids + ids
        text = (self.prompt_text if self.req.echo else "") + done.text
        choice = {"text": text, "index": 0, "logprobs": self._logprobs(lps, ids, 0), "finish_reason": done.finish}
        return self._obj(choice, self.usage(done))

    def first_chunks(self) -> list[dict]:
        """The echoed prompt (its logprobs are not streamed)."""
        if not self.req.echo:
            return []
        return [self._obj({"text": self.prompt_text, "index": 0, "logprobs": None, "finish_reason": None})]

    def chunks(self, event: Delta | Done, include_usage: bool) -> list[dict]:
        if isinstance(event, Delta):
            lps = self._logprobs(event.logprobs, [lp.token for lp in event.logprobs], self.offset)
            self.offset += len(event.text)
            return [self._obj({"text": event.text, "index": 0, "logprobs": lps, "finish_reason": None})]
        out = [self._obj({"text": "", "index": 0, "logprobs": None, "finish_reason": event.finish})]
        if include_usage:
            out.append({**self._obj({}), "choices": [], "usage": self.usage(event)})
        return out

