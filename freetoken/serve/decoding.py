"""One request's next-token choice. The model's logits are shaped by OpenAI's presence / frequency penalties, the
logit bias and a grammar mask, then sampled; reported logprobs are the model's own distribution (the log-softmax
of the unshaped logits), as OpenAI reports them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from freetoken.engine.sampling import Sampler, SamplingParams
from freetoken.serve.chat import Params
from freetoken.serve.grammar import GrammarMask


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the n most likely tokens, most likely first


def top_logprobs(logits: torch.Tensor, token: int, n: int) -> TokenLogprob:
    """logits [V] -> the token's logprob and the n best."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [V]
    values, ids = torch.topk(logprobs, min(n, logprobs.numel())) if n else (torch.empty(0), torch.empty(0))
    return TokenLogprob(token, float(logprobs[token]), tuple(zip(ids.tolist(), values.tolist())))


class Decoder:
    def __init__(self, params: Params, sampling: SamplingParams, grammar: GrammarMask | None = None):
        self.params, self.grammar = params, grammar
        self.sample = Sampler(sampling)
        self.counts: dict[int, int] = {}  # output token -> occurrences, for the penalties
        self.logprob: TokenLogprob | None = None  # of the last choice, when params.logprobs is set
        self.forced: list[int] = []  # tokens to emit next instead of sampling (closing a reasoning budget)

    def __call__(self, logits: torch.Tensor) -> int:
        """logits [V] (any device) -> the next token id."""
        p = self.params
        logits = logits.detach().float().cpu()  # [V]
        shaped = logits
        if self.counts and (p.presence_penalty or p.frequency_penalty) or p.logit_bias or self.grammar:
            shaped = logits.clone()
            if self.counts and (p.presence_penalty or p.frequency_penalty):
                ids = torch.tensor(list(self.counts))
                n = torch.tensor(list(self.counts.values()), dtype=torch.float32)
                shaped[ids] -= p.presence_penalty + p.frequency_penalty * n
            if p.logit_bias:
                shaped[torch.tensor(list(p.logit_bias))] += torch.tensor(list(p.logit_bias.values()))
            if self.grammar:
                self.grammar.mask(shaped)
        token = self.forced.pop(0) if self.forced else self.sample(shaped)
        if p.logprobs is not None:
            self.logprob = top_logprobs(logits, token, p.logprobs)
        if self.grammar:
            self.grammar.accept(token)
        self.counts[token] = self.counts.get(token, 0) + 1
        return token
