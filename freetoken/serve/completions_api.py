"""OpenAI (legacy) Completions, what evaluation harnesses call: prompts as text or token ids, one or a batch of them
(each with n samples, or the n best of best_of), echo, and logprobs in the legacy form (tokens, token_logprobs,
top_logprobs, text_offset), of the prompt too when echoed (lm-eval's loglikelihood: echo, logprobs, max_tokens 0).
Choice i * n + j is prompt i's sample j, as OpenAI and vLLM number them."""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import Field

from freetoken.serve.chat import ChatInput, Prompt
from freetoken.serve.decoding import TokenLogprob
from freetoken.serve.errors import APIError
from freetoken.serve.fields import check_fields
from freetoken.serve.openai_api import (ACCEPTED, MAX_N, MAX_TOP_LOGPROBS, REFUSED, Lenient, StreamOptions,
                                        openai_params, response_schema, sampling_fields, samples, schema_param)
from freetoken.serve.openai_output import TokenText, best, usage
from freetoken.serve.service import Delta, Done, truncated
from freetoken.serve.vllm_fields import VLLMFields, apply_extras, constraint_of

MAX_PROMPTS = 128


class CompletionRequest(Lenient, VLLMFields):
    model: str
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)  # OpenAI's default; 0 with echo: the prompt's logprobs only
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = Field(None, ge=1, le=MAX_N)
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None  # vLLM's extension: json_object / json_schema
    add_special_tokens: bool = True  # vLLM's default for completions (a BOS where the tokenizer adds one)


def prompts_of(req: CompletionRequest) -> list[str | list[int]]:
    """The prompts: one text or token-id list, or a batch of them."""
    p = req.prompt
    batch = p if isinstance(p, list) and p and isinstance(p[0], (str, list)) else [p]
    if len(batch) > MAX_PROMPTS:
        raise APIError(400, f"prompt: at most {MAX_PROMPTS} prompts per request, got {len(batch)}", "prompt")
    for i, one in enumerate(batch):
        if not one:
            raise APIError(400, f"prompt[{i}]: must not be empty" if len(batch) > 1 else "prompt: must not be empty",
                           "prompt")
    return batch


def completion_input(req: CompletionRequest) -> tuple[ChatInput, int, int]:
    """(the request, n, best_of)."""
    check_fields(req, REFUSED, ACCEPTED)
    n, best_of = samples(req.n, req.best_of, req.stream)
    if req.stream and req.echo and req.logprobs is not None:
        raise APIError(400, "echo: the prompt's logprobs are not streamed; use stream: false", "echo")
    if req.max_tokens == 0 and not req.echo:
        raise APIError(400, "max_tokens: 0 only with echo (the prompt's logprobs)", "max_tokens")
    constraint = constraint_of(req, response_schema(req.response_format), schema_param(req.response_format))
    params = openai_params(req.max_tokens, req.temperature, req.top_p, req.stop, req.seed,
                           **sampling_fields(req, req.logprobs), constraint=constraint, track_logprob=best_of > n)
    if req.echo and req.logprobs is not None:
        params.prompt_logprobs = req.logprobs
    apply_extras(req, params)
    return ChatInput([], None, params), n, best_of


def legacy_logprobs(lps: list[TokenLogprob | None], ids: list[int], text: TokenText, offset: int) -> dict:
    """{tokens, token_logprobs, top_logprobs, text_offset}; lps[i] None (the first prompt token) has no logprob."""
    tokens = [text(t) for t in ids]
    offsets, at = [], offset
    for shown in tokens:
        offsets.append(at)
        at += len(shown)
    return {"tokens": tokens, "token_logprobs": [None if lp is None else lp.logprob for lp in lps],
            "top_logprobs": [None if lp is None else {text(t): v for t, v in lp.top} for lp in lps],
            "text_offset": offsets}


class Completion:
    """prompts: (text, token ids) per prompt; choice k belongs to prompt k // n."""

    def __init__(self, model: str, req: CompletionRequest, prompts: list[tuple[str, list[int]]], n: int,
                 text: TokenText):
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model, self.req, self.prompts, self.n, self.text = model, req, prompts, n, text
        self.offsets = {}  # choice -> chars before its next streamed text
        self.dones: list[Done] = []

    def _obj(self, choices: list[dict], usage_: dict | None = None) -> dict:
        out = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
               "choices": choices}
        return {**out, "usage": usage_} if usage_ is not None else out

    def _logprobs(self, lps: list, ids: list[int], offset: int) -> dict | None:
        return None if self.req.logprobs is None else legacy_logprobs(lps, ids, self.text, offset)

    def _choice(self, done: Done) -> dict:
        prompt_text, prompt_ids = self.prompts[done.index // self.n]
        lps, ids = list(done.logprobs), [lp.token for lp in done.logprobs]
        if self.req.echo and done.prompt_logprobs is not None:
            lps, ids = done.prompt_logprobs + lps, prompt_ids + ids
        text = (prompt_text if self.req.echo else "") + done.text
        out = {"text": text, "index": done.index, "logprobs": self._logprobs(lps, ids, 0),
               "finish_reason": done.finish}
        if self.req.prompt_logprobs is not None:
            from freetoken.serve.openai_output import prompt_logprobs_json

            out["prompt_logprobs"] = prompt_logprobs_json(done.prompt_logprobs, self.text)
        return out

    def response(self, dones: list[Done]) -> dict:
        """dones: every sample by index (best_of of them per prompt; the n best are kept)."""
        per = len(dones) // len(self.prompts)
        kept = [d for i in range(len(self.prompts)) for d in best(dones[i * per:(i + 1) * per], self.n)]
        for k, d in enumerate(kept):
            d.index = k
        return self._obj([self._choice(d) for d in kept], usage(kept, len(self.prompts)))

    def first_chunks(self) -> list[dict]:
        """The echoed prompts (their logprobs are not streamed)."""
        if not self.req.echo:
            return []
        return [self._obj([{"text": self.prompts[k // self.n][0], "index": k, "logprobs": None,
                            "finish_reason": None}]) for k in range(len(self.prompts) * self.n)]

    def chunks(self, index: int, event: Delta | Done, include_usage: bool, last: bool) -> list[dict]:
        if isinstance(event, Delta):
            offset = self.offsets.get(index, len(self.prompts[index // self.n][0]) if self.req.echo else 0)
            lps = self._logprobs(event.logprobs, [lp.token for lp in event.logprobs], offset)
            self.offsets[index] = offset + len(event.text)
            return [self._obj([{"text": event.text, "index": index, "logprobs": lps, "finish_reason": None}])]
        self.dones.append(event)
        out = [self._obj([{"text": "", "index": index, "logprobs": None, "finish_reason": event.finish}])]
        if include_usage and last:
            out.append(self._obj([], usage(sorted(self.dones, key=lambda d: d.index), len(self.prompts))))
        return out


def completion_prompts(service, batch: list[str | list[int]], req: CompletionRequest) -> list[tuple[str, Prompt]]:
    """Each prompt's text and tokens (text tokenized with add_special_tokens, ids checked against the vocabulary),
    its last truncate_prompt_tokens kept, with room left to generate. Runs off the event loop."""
    chat, vocab, out = service.backend.chat, service.backend.vocab_size, []
    for i, given in enumerate(batch):
        param = "prompt" if len(batch) == 1 else f"prompt[{i}]"
        if isinstance(given, str):
            ids, text = chat.encode(given, req.add_special_tokens), given
        else:
            if not all(isinstance(t, int) and 0 <= t < vocab for t in given):
                raise APIError(400, f"{param}: token ids must lie in [0, {vocab})", "prompt")
            ids, text = list(given), chat.decode(given)
        prompt = truncated(Prompt(list(ids), []), req.truncate_prompt_tokens)
        if len(prompt.tokens) < len(ids):
            text = chat.decode(prompt.tokens)
        service.check_room(prompt, "prompt")
        out.append((text, prompt))
    return out
