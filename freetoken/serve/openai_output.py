"""OpenAI Chat Completions replies: the response object (one choice per sample) and its SSE chunks, logprobs in
OpenAI's form, vLLM's prompt_logprobs, echo and return_tokens_as_token_ids."""

from __future__ import annotations

import time
import uuid

from freetoken.serve.decoding import TokenLogprob
from freetoken.serve.service import Delta, Done


class TokenText:
    """A token's text as the reply shows it: decoded, or "token_id:N" (vLLM's return_tokens_as_token_ids)."""

    def __init__(self, decode, as_ids: bool = False):
        self.decode, self.as_ids = decode, as_ids

    def __call__(self, token: int) -> str:
        return f"token_id:{token}" if self.as_ids else self.decode([token])


def logprob_json(lp: TokenLogprob, text: TokenText) -> dict:
    """OpenAI's form of one token's logprob: token text, its UTF-8 bytes, the top alternatives."""
    def one(token: int, value: float) -> dict:
        shown = text(token)
        return {"token": shown, "logprob": value, "bytes": list(shown.encode())}

    return {**one(lp.token, lp.logprob), "top_logprobs": [one(t, v) for t, v in lp.top]}


def choice_logprobs(lps: list[TokenLogprob], text: TokenText, wanted: bool) -> dict | None:
    return {"content": [logprob_json(lp, text) for lp in lps]} if wanted else None


def prompt_logprobs_json(lps: list[TokenLogprob | None] | None, text: TokenText) -> list | None:
    """vLLM's form: per prompt token (None for the first) {token id: {logprob, rank, decoded_token}}, the prompt's
    own token first, then the top alternatives."""
    if lps is None:
        return None
    out = []
    for lp in lps:
        if lp is None:
            out.append(None)
            continue
        entry = {str(lp.token): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": text(lp.token)}}
        for rank, (t, v) in enumerate(lp.top, start=1):
            entry.setdefault(str(t), {"logprob": v, "rank": rank, "decoded_token": text(t)})
        out.append(entry)
    return out


def usage(dones: list[Done], prompts: int = 1) -> dict:
    """Prompt tokens once per prompt (the samples of a prompt share it), completion tokens of every sample."""
    firsts = dones[::max(1, len(dones) // prompts)]
    prompt, cached = sum(d.prompt_tokens for d in firsts), sum(d.cached_tokens for d in firsts)
    completion = sum(d.completion_tokens for d in dones)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def best(dones: list[Done], n: int) -> list[Done]:
    """The n samples with the highest summed logprob of their tokens (best_of), renumbered 0..n-1."""
    if len(dones) == n:
        return dones
    chosen = sorted(dones, key=lambda d: -d.cumulative_logprob)[:n]
    for i, d in enumerate(chosen):
        d.index = i
    return chosen


def tool_calls_json(done: Done) -> list[dict]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in done.tool_calls]


class ChatCompletion:
    """Builds the response object and the stream chunks of one request's choices."""

    def __init__(self, model: str, text: TokenText, logprobs: bool = False, echo: str = ""):
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model, self.text, self.logprobs, self.echo = model, text, logprobs, echo
        self.dones: list[Done] = []

    def _choice(self, done: Done) -> dict:
        content = self.echo + done.text
        message = {"role": "assistant", "content": content if (content or not done.tool_calls) else None}
        if done.reasoning:
            message["reasoning_content"] = done.reasoning
        if done.tool_calls:
            message["tool_calls"] = tool_calls_json(done)
        return {"index": done.index, "message": message, "finish_reason": done.finish,
                "logprobs": choice_logprobs(done.logprobs, self.text, self.logprobs)}

    def response(self, dones: list[Done]) -> dict:
        out = {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
               "choices": [self._choice(d) for d in dones], "usage": usage(dones)}
        if dones and dones[0].prompt_logprobs is not None:
            out["prompt_logprobs"] = prompt_logprobs_json(dones[0].prompt_logprobs, self.text)
        return out

    def chunk(self, index: int, delta: dict, finish: str | None = None, logprobs: dict | None = None) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]}

    def chunks(self, index: int, event: Delta | Done, include_usage: bool, last: bool) -> list[dict]:
        """last: this Done is the request's last (usage follows it)."""
        if isinstance(event, Delta):
            key = "reasoning_content" if event.kind == "reasoning" else "content"
            return [self.chunk(index, {key: event.text}, None,
                               choice_logprobs(event.logprobs, self.text, self.logprobs))]
        self.dones.append(event)
        out = []
        if event.tool_calls:
            out.append(self.chunk(index, {"tool_calls": [{"index": i, **c}
                                                         for i, c in enumerate(tool_calls_json(event))]}))
        out.append(self.chunk(index, {}, event.finish))
        if include_usage and last:
            out.append({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                        "model": self.model, "choices": [], "usage": usage(sorted(self.dones, key=lambda d: d.index))})
        return out

    def first_chunks(self, n: int) -> list[dict]:
        return [self.chunk(i, {"role": "assistant", "content": self.echo}) for i in range(n)]
