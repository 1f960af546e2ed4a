"""Next-token choice from logits: greedy, or temperature with optional min-p / top-k / top-p, from a seeded
generator, on the logits' device; logit bias and the repetition, presence and frequency penalties over the tokens so
far (engine/penalties.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from freetoken.engine.host_sampling import by_blocks, cut_below, first_argmax, host_pick, top_p_threshold
from freetoken.engine.penalties import Penalties, shapes_logits
from freetoken.models.config import CheckpointError
from freetoken.models.generation_config import FILE, GenerationDefaults
from freetoken.placement.config import ConfigError

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed takes


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    greedy: bool = False
    seed: int | None = None
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one (after temperature)
    repetition_penalty: float = 1.0  # HF's: logits of the prompt's and the output's tokens divided (> 0) or multiplied
    presence_penalty: float = 0.0  # OpenAI's: minus this once a token has appeared in the output
    frequency_penalty: float = 0.0  # minus this per earlier occurrence in the output
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit in [-100, 100])

    def __post_init__(self) -> None:
        """ConfigErrors: the field's name first (an API's own parameter names), or `ft generate`'s flag."""
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):  # nan fails every comparison
            raise ConfigError("{temperature} must be a finite number >= 0, got {v}", v=self.temperature)
        if not 0 < self.top_p <= 1:
            raise ConfigError("{top_p} must lie in (0, 1], got {v}", v=self.top_p)
        if self.top_k < 0:
            raise ConfigError("{top_k} must be >= 0, got {v}", v=self.top_k)
        if not 0 <= self.min_p <= 1:
            raise ConfigError("{min_p} must lie in [0, 1], got {v}", v=self.min_p)
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            raise ConfigError("{repetition_penalty} must be a finite number > 0, got {v}", v=self.repetition_penalty)
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ConfigError("{%s} must lie in [-2, 2], got {v}" % name, v=getattr(self, name))
        for token, bias in self.logit_bias:
            if token < 0 or not -100 <= bias <= 100:
                raise ConfigError("{logit_bias} takes token ids >= 0 with biases in [-100, 100], got {v}",
                                  v=f"{token}={bias}")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise ConfigError("{seed} must lie in [{lo}, {hi}] (torch's 64 bits), got {v}", lo=SEED_MIN, hi=SEED_MAX,
                              v=self.seed)

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0


class Sampler:
    """Chooses on the logits' own device: the sampled id is the only value read back (`__call__`), or none at all
    (`pick`). No full-vocabulary sort: top-k is a selection, top-p works on the top-k candidates' sorted
    probabilities or, without top-k, finds its probability threshold by a radix select; the draw is an exponential
    race (argmax of p / Exp(1), which picks token i with probability p_i). One seeded generator per device, so a seed
    gives the same tokens on the same device."""

    def __init__(self, params: SamplingParams, prompt: list[int] = ()):
        """prompt: the tokens the repetition penalty covers besides the ones this sampler chooses (`__call__`)."""
        self.params = params
        self._gens: dict[torch.device, torch.Generator] = {}
        self._seed = params.seed if params.seed is not None else int(torch.Generator().seed())
        self._prompt = list(prompt)
        self._shapes = shapes_logits(params)  # logit bias or penalties to apply
        self.penalties: Penalties | None = None  # on the logits' device, from the first call

    def generator(self, device: torch.device) -> torch.Generator:
        gen = self._gens.get(device)
        if gen is None:
            gen = self._gens[device] = torch.Generator(device=device)
            gen.manual_seed(self._seed)
        return gen

    def __call__(self, logits: torch.Tensor) -> int:
        """logits [V] (any device) -> a token id, after the logit bias and the penalties over the prompt and the
        tokens chosen here before (vLLM's order: they, then temperature and the cuts)."""
        if self._shapes:
            if self.penalties is None:
                V = logits.numel()
                bad = next((t for t, _ in self.params.logit_bias if t >= V), None)
                if bad is not None:
                    raise ConfigError("{logit_bias}: token id {t} is not in the vocabulary of {V}", t=bad, V=V)
                self.penalties = Penalties.of(self.params, V, logits.device, self._prompt)
            logits = self.penalties(logits.detach().float())
        token = int(self.pick(logits))
        if self.penalties is not None:
            self.penalties.accept(token)
        return token

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [V] (any device) -> the token id as a 0-d int64 tensor on that device (nothing read back)."""
        logits = logits.detach().float()  # [V]
        if self.params.is_greedy:
            return first_argmax(logits)
        gen = self.generator(logits.device)
        if by_blocks(logits):  # a long vector on the CPU: the same distribution, fewer passes over V
            return host_pick(logits, self.params, gen)
        probs = allowed_probs(logits, self.params)  # [V], 0 where cut
        return race(probs, gen)


def race(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """probs [n] -> index i drawn with probability probs[i] / sum (argmax of p / Exp(1)), 0-d int64."""
    u = torch.rand(probs.shape, generator=gen, device=probs.device)  # [n]
    exp = -torch.log1p(-u)  # [n] Exp(1); u < 1
    return first_argmax(probs / exp.clamp_min_(torch.finfo(torch.float32).tiny))


def min_p_cut(logits: torch.Tensor, min_p: float, temperature: float = 1.0) -> torch.Tensor:
    """logits [V] -> -inf where the token's probability at `temperature` is below min_p x the most likely one's."""
    return logits.masked_fill(logits < logits.max() + temperature * math.log(min_p), float("-inf"))


def allowed_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """logits [V] fp32 -> the sampling distribution [V]: temperature, then min-p (vLLM's order), then top-k (ties
    with the k-th logit kept), then top-p (the smallest set of most likely tokens whose mass reaches top_p; ties with
    its last one kept), renormalised."""
    logits = logits / p.temperature
    if p.min_p > 0:
        logits = min_p_cut(logits, p.min_p)
    V = logits.numel()
    top = None
    if p.top_k and p.top_k < V:
        values, top = torch.topk(logits, p.top_k)  # [k] descending: a selection, not a sort
        logits = logits.masked_fill(logits < values[-1], float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # [V]
    if p.top_p < 1:
        if top is not None:
            threshold = _sorted_threshold(probs[top], p.top_p)
        else:
            # the CPU sorts (numpy: ~0.05 ms for a short vector, where the radix select's 3 rounds of scatters
            # cost ~0.6), a device selects without a host read
            threshold = top_p_threshold(probs, p.top_p) if probs.is_cpu else _radix_threshold(probs, p.top_p)
        probs = cut_below(probs, threshold) if by_blocks(probs) else torch.where(probs >= threshold, probs, 0.0)
        probs = probs / probs.sum()
    return probs


def _sorted_threshold(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """sorted_probs [k] descending (the top-k candidates' probabilities) -> the smallest kept probability: a token
    is kept while the mass strictly before it is below top_p."""
    before = torch.cumsum(sorted_probs, 0) - sorted_probs  # [k]
    return torch.where(before < top_p, sorted_probs, float("inf")).min()


RADIX = ((20, 2048), (9, 2048), (0, 512))  # (shift, buckets): the 31 bits of a non-negative float, high first


def _radix_threshold(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs [V] -> the probability t with mass(p > t) < top_p <= mass(p >= t): the smallest kept one. A radix
    select over the float bit patterns (ordered as non-negative floats are): three rounds of a bucketed mass sum
    over V, each narrowing the prefix of t's bits. No sort, no host read."""
    bits = probs.view(torch.int32)  # [V] (// below: an int32 tensor shifted by a Python int is slow on the CPU)
    prefix = torch.zeros((), dtype=torch.int32, device=probs.device)  # t's bits found so far
    above = torch.zeros((), dtype=torch.float32, device=probs.device)  # mass of tokens above the prefix
    shift_prev = 31
    for shift, buckets in RADIX:
        key = bits // (1 << shift) & (buckets - 1)  # [V] the next bits
        if shift_prev < 31:  # tokens outside the prefix go to the spare bucket
            key = torch.where(bits // (1 << shift_prev) == prefix, key, buckets)
        mass = torch.zeros(buckets + 1, dtype=torch.float32, device=probs.device).scatter_add_(0, key.long(), probs)
        mass = mass[:buckets]  # [B]
        from_top = torch.flip(torch.cumsum(torch.flip(mass, (0,)), 0), (0,))  # [B] mass of buckets >= j
        j = (((above + from_top) >= top_p).sum() - 1).clamp_min(0).view(1)  # [1] the bucket holding t
        above = above + (from_top.gather(0, j) - mass.gather(0, j))[0]  # gather: no host read of j
        prefix = prefix * (1 << (shift_prev - shift)) + j[0].to(torch.int32)
        shift_prev = shift
    return prefix.view(1).view(torch.float32)[0]


def sampling_params(defaults, temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
                    greedy: bool = False, seed: int | None = None, min_p: float | None = None,
                    repetition_penalty: float | None = None, **rest) -> SamplingParams:
    """What the caller set, else the checkpoint's generation_config.json defaults (models.generation_config
    .GenerationDefaults), else 1.0 / 1.0 / 0 / 0.0 / 1.0. rest: the fields the file does not set (presence and
    frequency penalties, logit bias), as given."""
    return SamplingParams(temperature=0.0 if greedy else _given_or_default(temperature, defaults.temperature, 1.0),
                          top_p=_given_or_default(top_p, defaults.top_p, 1.0),
                          top_k=int(_given_or_default(top_k, defaults.top_k, 0)), greedy=greedy, seed=seed,
                          min_p=_given_or_default(min_p, defaults.min_p, 0.0),
                          repetition_penalty=_given_or_default(repetition_penalty, defaults.repetition_penalty, 1.0),
                          **rest)


def _given_or_default(given, default, fallback):
    return given if given is not None else (default if default is not None else fallback)


def load_generation_defaults(model_dir: str | Path) -> GenerationDefaults:
    """generation_config.json's values checked against the rules of the sampling they become, an error naming the
    file and its field (never a flag or request field the caller did not give)."""
    defaults = GenerationDefaults.load(model_dir)
    given = {k: getattr(defaults, k) for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
             if getattr(defaults, k) is not None}
    try:
        SamplingParams(**given)
    except ConfigError as e:
        raise CheckpointError(e.render({k: f"{Path(model_dir) / FILE}: {k}" for k in given})) from None
    return defaults
