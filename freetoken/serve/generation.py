"""One sequence through a model with the prefix cache in front: reuse the cached KV of the longest common prefix,
prefill the rest, sample token by token, and cache the KV of everything computed when the sequence ends."""

from __future__ import annotations

from typing import Protocol

import torch

from freetoken.serve.chat import Prompt
from freetoken.serve.decoding import Decoder, TokenLogprob, choose, top_logprobs
from freetoken.serve.prefix_cache import PrefixCache


class KVSequence(Protocol):
    """A model's KV cache for one sequence, filled in position order."""

    length: int  # positions filled

    def load(self, pieces: list, tokens: list[int]) -> None:
        """Fills positions [0, len(tokens)) from prefix-cache pieces (in order) on an empty sequence."""

    def mark(self, anchors: list[int]) -> None:
        """Positions the sequence should be able to restart from later (message ends): hybrid models snapshot
        their recurrent state there as they pass them."""

    def forward(self, tokens: list[int], all_logits: bool = False, decode: bool = False) -> torch.Tensor:
        """Runs tokens at positions [length, length + len); returns the logits of the last one, [V] (all_logits:
        of every one, [T, V]). decode: one sampled token fed back (a prompt chunk of one token is still prefill)."""

    def read(self, start: int, stop: int):
        """The KV of positions [start, stop) as one prefix-cache piece."""


class CachedGeneration:
    """The Generation a backend hands the service (see service.Generation). A sequence that follows another one of
    the same prompt (n > 1, best_of) starts from a copy of that one's prompt KV and last logits once it has
    prefilled, instead of prefilling again (where the sequence's KV can be sliced; else it prefills itself)."""

    def __init__(self, seq: KVSequence, cache: PrefixCache | None, prompt: Prompt, decoder: Decoder, max_new: int,
                 stop_token_ids: set[int], prefill_chunk: int | None = None):
        self.seq, self.cache, self.prompt, self.decoder, self.max_new = seq, cache, prompt, decoder, max_new
        self.stop_token_ids = stop_token_ids
        self.prefill_chunk = prefill_chunk  # prompt tokens per step (None: all at once)
        self._prefilled: int | None = None  # prompt positions done; None: not looked up in the prefix cache yet
        self.reused_tokens = 0
        self.generated: list[int] = []
        self.prompt_logprobs: list[TokenLogprob | None] | None = None  # when the decoder's params ask for them
        self.prompt_logits: torch.Tensor | None = None  # [V] of the prompt's last position, kept for followers
        self.leader: CachedGeneration | None = None  # the sequence whose prompt KV this one copies
        self._logits: torch.Tensor | None = None
        self._closed = False

    def follow(self, leader: "CachedGeneration") -> None:
        if getattr(self.seq, "forkable", False) and leader.prompt.tokens == self.prompt.tokens:
            self.leader = leader

    def _copy_leader(self) -> torch.Tensor | None:
        """The leader's prompt logits after loading a copy of its prompt KV; None while it is still prefilling."""
        leader, n = self.leader, len(self.prompt.tokens)
        if leader.prompt_logits is None:
            return None
        self.seq.load([leader.seq.read(0, n)], self.prompt.tokens)
        self.reused_tokens, self.prompt_logprobs = n, leader.prompt_logprobs
        return leader.prompt_logits

    def __iter__(self):
        return self

    @property
    def started(self) -> bool:
        """Prefilled: the next step is a decode of the last sampled token."""
        return self._logits is not None

    @property
    def finished(self) -> bool:
        """Closed, at max_new, or ended by a stop token (which is never fed back)."""
        return self._closed or (self.started and (len(self.generated) >= self.max_new or (
            bool(self.generated) and self.generated[-1] in self.stop_token_ids)))

    def take(self, logits: torch.Tensor) -> int:
        """The next token from this step's logits [V], computed outside (a batched decode step)."""
        return self.commit(self.propose(logits).tolist())

    def propose(self, logits: torch.Tensor) -> torch.Tensor:
        """take() up to the read-back: the decoder's [3] values on the logits' device."""
        self._logits = logits
        return self.decoder.propose(logits)

    def shape_(self, logits: torch.Tensor, shaped: torch.Tensor) -> None:
        """A decode batch's propose(), this sequence's part: logits [V] fp32 (its row of the step's), shaped [V] a
        copy shaped in place; choose() then finishes the batch."""
        self._logits = logits
        self.decoder.shape_(logits, shaped)

    @staticmethod
    def choose(gens: list["CachedGeneration"], logits: torch.Tensor, shaped: torch.Tensor) -> torch.Tensor:
        """logits, shaped [B, V] (row b: gens[b].shape_() done) -> [B, 3], row b what gens[b].propose() gives."""
        return choose([g.decoder for g in gens], logits, shaped)

    def commit(self, values: list[int]) -> int:
        """take() from propose()'s values, read back."""
        tok = self.decoder.commit(*values)
        self.generated.append(tok)
        return tok

    def __next__(self) -> int | None:
        """The next token; None while the prompt is still being prefilled (one chunk per call)."""
        if self.finished:
            raise StopIteration
        if self._logits is None and self.leader is not None:
            logits = self._copy_leader()
            if logits is None:
                return None
            self._logits = self.prompt_logits = logits
            if not self.max_new:
                raise StopIteration
            return self.take(logits)
        if self._logits is None:  # prefill
            tokens = self.prompt.tokens
            if self._prefilled is None:
                self.seq.mark(self.prompt.anchors)
            if self.decoder.params.prompt_logprobs is not None:  # every prompt position's logits: nothing reused
                logits = self._prefill_with_logprobs(tokens)
            else:
                if self._prefilled is None:
                    self._prefilled = self._reuse(tokens)
                end = len(tokens) if self.prefill_chunk is None else min(len(tokens),
                                                                         self._prefilled + self.prefill_chunk)
                logits = self.seq.forward(tokens[self._prefilled:end])
                self._prefilled = end
                if end < len(tokens):
                    return None
            self._logits = self.prompt_logits = logits
            if not self.max_new:  # max_tokens 0: the prompt's logprobs only
                raise StopIteration
            return self.take(self._logits)
        return self.take(self.seq.forward(self.generated[-1:], decode=True))

    def _reuse(self, tokens: list[int]) -> int:
        """Loads the longest cached prefix; -> its length."""
        if self.cache is not None:
            match = self.cache.match(tokens)
            if match.length:
                self.seq.load(match.kv, tokens[:match.length])
            self.reused_tokens = match.length
        return self.reused_tokens

    def _prefill_with_logprobs(self, tokens: list[int]) -> torch.Tensor:
        logits = self.seq.forward(tokens, all_logits=True)  # [T, V]
        n = self.decoder.params.prompt_logprobs or 0
        self.prompt_logprobs = [None] + [top_logprobs(logits[i - 1], tokens[i], n) for i in range(1, len(tokens))]
        return logits[-1]

    def close(self) -> None:
        """Caches the KV of every position computed: the prompt and all sampled tokens but the last."""
        if self._closed:
            return
        self._closed = True
        if self.cache is None or self._logits is None:
            return
        tokens = (self.prompt.tokens + self.generated)[: self.seq.length]
        self.cache.insert(tokens, self.seq.read, self.prompt.anchors)
