"""Next-token choice from logits: greedy, or temperature with optional top-k / top-p, from a seeded generator."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

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

    def __post_init__(self) -> None:
        """ConfigErrors: the field's name first (an API's own parameter names), or `ft generate`'s flag."""
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):  # nan fails every comparison
            raise ConfigError("{temperature} must be a finite number >= 0, got {v}", v=self.temperature)
        if not 0 < self.top_p <= 1:
            raise ConfigError("{top_p} must lie in (0, 1], got {v}", v=self.top_p)
        if self.top_k < 0:
            raise ConfigError("{top_k} must be >= 0, got {v}", v=self.top_k)
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise ConfigError("{seed} must lie in [{lo}, {hi}] (torch's 64 bits), got {v}", lo=SEED_MIN, hi=SEED_MAX,
                              v=self.seed)

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.gen = torch.Generator()
        if params.seed is not None:
            self.gen.manual_seed(params.seed)
        else:
            self.gen.seed()

    def __call__(self, logits: torch.Tensor) -> int:
        """logits [V] (any device) -> a token id."""
        p = self.params
        logits = logits.detach().float().cpu()
        if p.is_greedy:
            return int(torch.argmax(logits))
        logits = logits / p.temperature
        if p.top_k and p.top_k < logits.numel():
            kth = torch.topk(logits, p.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.top_p < 1:
            sorted_p, order = torch.sort(probs, descending=True)
            cum = torch.cumsum(sorted_p, dim=0)
            drop = cum - sorted_p >= p.top_p  # keep the smallest prefix whose mass reaches top_p
            sorted_p[drop] = 0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        return int(torch.multinomial(probs, 1, generator=self.gen))


def sampling_params(defaults, temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
                    greedy: bool = False, seed: int | None = None) -> SamplingParams:
    """What the caller set, else the checkpoint's generation_config.json defaults (models.generation_config
    .GenerationDefaults), else 1.0 / 1.0 / 0."""
    def pick(given, default, fallback):
        return given if given is not None else (default if default is not None else fallback)

    return SamplingParams(temperature=0.0 if greedy else pick(temperature, defaults.temperature, 1.0),
                          top_p=pick(top_p, defaults.top_p, 1.0), top_k=int(pick(top_k, defaults.top_k, 0)),
                          greedy=greedy, seed=seed)


def load_generation_defaults(model_dir: str | Path) -> GenerationDefaults:
    """generation_config.json's values checked against the rules of the sampling they become, an error naming the
    file and its field (never a flag or request field the caller did not give)."""
    defaults = GenerationDefaults.load(model_dir)
    given = {k: v for k, v in (("temperature", defaults.temperature), ("top_p", defaults.top_p),
                               ("top_k", defaults.top_k)) if v is not None}
    try:
        SamplingParams(**given)
    except ConfigError as e:
        raise CheckpointError(e.render({k: f"{Path(model_dir) / FILE}: {k}" for k in given})) from None
    return defaults
