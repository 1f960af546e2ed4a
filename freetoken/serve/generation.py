"""One sequence through a model with the prefix cache in front: reuse the cached KV of the longest common prefix,
prefill the rest, sample token by token, and cache the KV of everything computed when the sequence ends."""

from __future__ import annotations

from typing import Protocol

import torch

from freetoken.engine.sampling import Sampler, SamplingParams
from freetoken.serve.chat import Params, Prompt
from freetoken.serve.prefix_cache import PrefixCache


class KVSequence(Protocol):
    """A model's KV cache for one sequence, filled in position order."""

    length: int  # positions filled

    def load(self, pieces: list, tokens: list[int]) -> None:
        """Fills positions [0, len(tokens)) from prefix-cache pieces (in order) on an empty sequence."""

    def mark(self, anchors: list[int]) -> None:
        """Positions the sequence should be able to restart from later (message ends): hybrid models snapshot
        their recurrent state there as they pass them."""

    def forward(self, tokens: list[int]) -> torch.Tensor:
        """Runs tokens at positions [length, length + len); returns the logits of the last one, [V]."""

    def read(self, start: int, stop: int):
        """The KV of positions [start, stop) as one prefix-cache piece."""


class CachedGeneration:
    """The Generation a backend hands the service (see service.Generation)."""

    def __init__(self, seq: KVSequence, cache: PrefixCache | None, prompt: Prompt, params: Params, max_new: int,
                 stop_token_ids: set[int]):
        self.seq, self.cache, self.prompt, self.params, self.max_new = seq, cache, prompt, params, max_new
        self.stop_token_ids = stop_token_ids
        self.reused_tokens = 0
        self.generated: list[int] = []
        self._logits: torch.Tensor | None = None
        self._closed = False
        self._sample = Sampler(SamplingParams(params.temperature, params.top_p, params.top_k, seed=params.seed))

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self._closed or len(self.generated) >= self.max_new or (
                self.generated and self.generated[-1] in self.stop_token_ids):
            raise StopIteration  # a stop token is never fed back: the sequence ends where the caller stops
        if self._logits is None:  # prefill
            tokens = self.prompt.tokens
            self.seq.mark(self.prompt.anchors)
            if self.cache is not None:
                match = self.cache.match(tokens)
                if match.length:
                    self.seq.load(match.kv, tokens[:match.length])
                self.reused_tokens = match.length
            self._logits = self.seq.forward(tokens[self.reused_tokens:])
        else:
            self._logits = self.seq.forward(self.generated[-1:])
        tok = self._sample(self._logits)
        self.generated.append(tok)
        return tok

    def close(self) -> None:
        """Caches the KV of every position computed: the prompt and all sampled tokens but the last."""
        if self._closed:
            return
        self._closed = True
        if self.cache is None or self._logits is None:
            return
        tokens = (self.prompt.tokens + self.generated)[: self.seq.length]
        self.cache.insert(tokens, self.seq.read, self.prompt.anchors)
