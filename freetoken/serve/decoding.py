"""One sequence's next-token choice. The model's logits are shaped in vLLM's order (min_tokens, allowed_token_ids,
bad_words, logit_bias, repetition / presence / frequency penalties, min_p, the grammar and UTF-8 masks), then
sampled (temperature, top_k, top_p); reported logprobs are the model's own distribution (the log-softmax of the
unshaped logits), as OpenAI reports them. A step that cannot choose (NaN logits, every token masked) raises an
APIError for this sequence alone."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from freetoken.engine.penalties import Penalties
from freetoken.engine.host_sampling import first_argmax
from freetoken.engine.sampling import Sampler, SamplingParams, min_p_cut
from freetoken.serve.chat import Params
from freetoken.serve.errors import APIError
from freetoken.serve.grammar import GrammarMask


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the n most likely tokens, most likely first
    rank: int = 1  # the token's place among all (1: the most likely)


def top_logprobs(logits: torch.Tensor, token: int, n: int) -> TokenLogprob:
    """logits [V] -> the token's logprob, its rank and the n best."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [V]
    values, ids = torch.topk(logprobs, min(n, logprobs.numel())) if n else (torch.empty(0), torch.empty(0))
    own = logprobs[token]
    return TokenLogprob(token, float(own), tuple(zip(ids.tolist(), values.tolist())),
                        1 + int((logprobs > own).sum()))


@dataclass(slots=True)
class Tables:
    """A sequence's shaping state as dense [V] tensors on the logits' device, made at its first step: each step
    shapes with elementwise ops and reads nothing back."""
    stop_ids: torch.Tensor  # [S] long: banned before min_tokens
    allowed: torch.Tensor | None  # [V] 0 / -inf: allowed_token_ids
    penalties: Penalties | None  # logit_bias, repetition / presence / frequency penalties

    @classmethod
    def make(cls, params: Params, stop_ids: torch.Tensor, prompt: torch.Tensor, V: int, device: torch.device
             ) -> "Tables":
        allowed = None
        if params.allowed_token_ids is not None:
            allowed = torch.full((V,), float("-inf"), device=device)
            allowed[torch.tensor(params.allowed_token_ids, dtype=torch.long, device=device)] = 0.0
        return cls(stop_ids.to(device), allowed, Penalties.of(params, V, device, prompt))

    def accept(self, token: int) -> None:
        if self.penalties is not None:
            self.penalties.accept(token)


class Decoder:
    def __init__(self, params: Params, sampling: SamplingParams, grammar: GrammarMask | None = None,
                 stop_ids: frozenset[int] = frozenset(), prompt: list[int] = (), bad_words: list[list[int]] = ()):
        """params' min_p and repetition_penalty are applied here (make_decoder fills them from the model's defaults;
        None: none), so `sampling` carries neither."""
        params = replace(params, min_p=params.min_p or 0.0, repetition_penalty=params.repetition_penalty or 1.0)
        sampling = replace(sampling, min_p=0.0, repetition_penalty=1.0)
        self.params, self.grammar, self.sampling = params, grammar, sampling
        self.sample = Sampler(sampling)
        self.stop_ids = torch.tensor(sorted(stop_ids), dtype=torch.long)
        self.prompt_ids = torch.tensor(sorted(set(prompt)), dtype=torch.long)  # repetition_penalty reads them
        self.bad_words = [w for w in bad_words if w]
        self.out: list[int] = []
        self.tables: Tables | None = None  # on the logits' device, from the first step
        self.logprob: TokenLogprob | None = None  # of the last choice, when params.logprobs is set
        self.cumulative = 0.0  # sum of the chosen tokens' logprobs (best_of ranks by it)
        self.forced: list[int] = []  # tokens to emit next instead of sampling (closing a reasoning budget)
        self._proposed: torch.Tensor | None = None  # [V] the logits propose() read, until commit()

    def __call__(self, logits: torch.Tensor) -> int:
        """logits [V] (any device) -> the next token id. Shaping and sampling run on the logits' device; the
        token and the two failure flags come back in one read."""
        return self.commit(*self.propose(logits).tolist())

    def propose(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [V] -> [3] int64 on their device: the sampled token (0 when one is forced), whether the logits
        hold NaN, whether shaping left no token; nothing read back. A decode batch runs the same two halves, each
        sequence's shape_() and then one choose() for all."""
        logits = logits.detach().float()  # [V]
        shaped = logits.clone()
        self.shape_(logits, shaped)
        return choose([self], logits, shaped)

    def shape_(self, logits: torch.Tensor, shaped: torch.Tensor) -> None:
        """The step's part that is this sequence's own (what fails here fails it alone): logits [V] fp32, the
        model's (kept for commit's logprobs), shaped [V] a copy of them, shaped in place."""
        if self.tables is None:
            self.tables = Tables.make(self.params, self.stop_ids, self.prompt_ids, logits.numel(), logits.device)
        self._proposed = logits
        self.shape(shaped)

    def commit(self, token: int, nan: int, dead: int) -> int:
        """propose()'s three values, read back -> the next token id (the forced one, if any); failures raise."""
        logits, self._proposed = self._proposed, None
        if self.forced:
            token = self.forced[0]
        if nan:
            raise APIError(500, "the model's logits hold NaN at this step; the sequence cannot continue", None,
                           "model_error")
        if dead:
            raise APIError(400, self._dead_end(), None, "no_token_allowed")
        if self.forced:
            self.forced.pop(0)
        if self.params.logprobs is not None or self.params.track_logprob:
            record = top_logprobs(logits, token, self.params.logprobs or 0)
            self.cumulative += record.logprob
            self.logprob = record if self.params.logprobs is not None else None
        if self.grammar:
            self.grammar.accept(token)
        self.out.append(token)
        self.tables.accept(token)
        return token

    def shape(self, shaped: torch.Tensor) -> None:
        """shaped [V] fp32, a copy of the logits, shaped in place on its device (elementwise ops and index writes;
        nothing read back)."""
        p, t, ninf = self.params, self.tables, float("-inf")
        if len(self.out) < p.min_tokens and len(t.stop_ids):
            shaped[t.stop_ids] = ninf
        if t.allowed is not None:
            shaped += t.allowed
        for word in self.bad_words:  # its last token is banned where the output ends with the rest of it
            if len(word) == 1 or self.out[-(len(word) - 1):] == word[:-1]:
                shaped[word[-1]] = ninf
        if t.penalties is not None:  # bias; repetition over the prompt's and the output's tokens; presence, frequency
            t.penalties.apply_(shaped)
        if p.min_p > 0 and not self.sampling.is_greedy:  # p_i >= min_p * p_max after temperature, in logits
            shaped.copy_(min_p_cut(shaped, p.min_p, self.sampling.temperature))
        if self.grammar:
            self.grammar.mask(shaped)

    def _dead_end(self) -> str:
        if self.grammar is not None:
            return (f"{self.params.constraint.param}: the constraint allows no token after "
                    f"{len(self.out)} tokens (with this request's other token limits)")
        return "no token is allowed at this step (allowed_token_ids, bad_words, logit_bias and min_tokens together)"


def choose(decoders: list[Decoder], logits: torch.Tensor, shaped: torch.Tensor) -> torch.Tensor:
    """logits [B, V] fp32 and shaped [B, V] (row b: decoders[b]'s shape_() done; [V] each for one decoder) -> [B, 3]
    ([3]) int64 on their device, row b what decoders[b].propose() gives: the greedy rows' argmax and every row's NaN /
    dead-end check are one op each over the batch (per-row ops cost a decode batch more than the model's step on a
    small model); sampled rows draw from their own generators, forced rows say 0."""
    greedy = [d.sampling.is_greedy and not d.forced for d in decoders]
    if all(greedy):
        tokens = first_argmax(shaped)  # [B]
    else:
        rows = shaped.view(len(decoders), -1)  # [B, V]
        zero = shaped.new_zeros((), dtype=torch.long)
        best = first_argmax(rows) if any(greedy) else None  # [B]
        tokens = torch.stack([best[b] if g else zero if d.forced else d.sample.pick(rows[b])
                              for b, (d, g) in enumerate(zip(decoders, greedy))]).view(shaped.shape[:-1])
    # amax propagates NaN and is -inf only where every token is masked: two vectorised reductions (isnan(x).any()
    # and isfinite(x).any() took ~0.4 and ~0.8 ms over 151,936 logits on one CPU thread, amax ~0.02)
    return torch.stack([tokens, torch.isnan(logits.amax(-1)).long(), (shaped.amax(-1) == float("-inf")).long()], -1)


def bad_word_ids(encode, words: list[str]) -> list[list[int]]:
    """vLLM's reading of bad_words: each word's tokens as it would start the text and after a space."""
    out = []
    for word in words:
        for variant in (word, " " + word.lstrip()):
            ids = encode(variant)
            if ids and ids not in out:
                out.append(ids)
    return out


def make_decoder(backend, grammars, params: Params, prompt: list[int], index: int = 0) -> Decoder:
    """A sequence's Decoder: the request's sampling (unset fields from generation_config.json; sequence `index`
    of n samples with seed + index, as vLLM seeds them), its constraint's grammar (compiled here, off the event
    loop; its errors are 400s naming the field), its stop tokens. Token ids the request names must be in the
    vocabulary."""
    from freetoken.engine.sampling import sampling_params

    vocab = backend.vocab_size
    for name, ids in (("logit_bias", list(params.logit_bias)), ("allowed_token_ids", params.allowed_token_ids or []),
                      ("stop_token_ids", params.stop_token_ids)):
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"{name}: token id {bad} is not in the vocabulary of {vocab}", name)
    seed = None if params.seed is None else params.seed + index
    try:
        sampling = sampling_params(backend.generation_defaults, params.temperature, params.top_p, params.top_k,
                                   seed=seed, min_p=params.min_p, repetition_penalty=params.repetition_penalty)
    except ValueError as e:  # SamplingParams' messages begin with the field's name
        raise APIError(400, str(e), str(e).split(" ", 1)[0])
    params = replace(params, min_p=sampling.min_p, repetition_penalty=sampling.repetition_penalty)  # the defaults
    grammar = None
    if params.constraint is not None:
        try:
            grammar = grammars.mask(params.constraint)
        except ValueError as e:
            raise APIError(400, str(e), params.constraint.param)
    stops = stop_ids(backend, params)
    return Decoder(params, sampling, grammar, stops, prompt if params.repetition_penalty != 1.0 else (),
                   bad_word_ids(backend.chat.encode, params.bad_words))


def stop_ids(backend, params: Params) -> frozenset[int]:
    """The tokens that end this request's sequences: the model's end-of-sequence ones (unless ignore_eos) and the
    request's stop_token_ids."""
    return frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else frozenset(backend.stop_token_ids))
