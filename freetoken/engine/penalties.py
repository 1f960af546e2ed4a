"""A sequence's history-dependent logit shaping, as dense [V] tables on the logits' device: logit bias, the
repetition penalty (HF's, over the prompt and the output) and the presence / frequency penalties (OpenAI's, over the
output), applied in vLLM's order. Each step is elementwise work and one index write per chosen token: nothing is
read back. The engine's Sampler and the server's Decoder both shape with it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch


def seen_flags(tokens, size: int, device: torch.device) -> torch.Tensor:
    """[size] bool on `device`, True at `tokens` (a list or a long tensor): the repetition penalty's table."""
    flags = torch.zeros(size, dtype=torch.bool, device=device)
    flags[torch.as_tensor(tokens, dtype=torch.long).to(device)] = True
    return flags


def penalize_repeats(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits [V], seen [V] bool -> the seen tokens' logits divided by the penalty where positive, multiplied where
    not (HF's RepetitionPenaltyLogitsProcessor, vLLM's repetition_penalty); elementwise, nothing read back."""
    return torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)


def history_shaped(params) -> bool:
    """Whether params' penalties depend on the tokens chosen so far (repetition, presence, frequency)."""
    return params.repetition_penalty != 1.0 or bool(params.presence_penalty) or bool(params.frequency_penalty)


def shapes_logits(params) -> bool:
    """Whether params' logit bias or penalties change any logit."""
    return bool(params.logit_bias) or history_shaped(params)


class Penalties:
    def __init__(self, size: int, device: torch.device, *, repetition: float = 1.0, presence: float = 0.0,
                 frequency: float = 0.0, bias: Mapping[int, float] | None = None, prompt: Iterable[int] = ()):
        """size: the vocabulary (V); prompt: the tokens the repetition penalty covers besides the output's."""
        self.repetition, self.presence, self.frequency = repetition, presence, frequency
        self.bias = None  # [V] fp32
        if bias:
            self.bias = torch.zeros(size, device=device)
            self.bias[torch.tensor(list(bias), dtype=torch.long, device=device)] = torch.tensor(
                [float(v) for v in bias.values()], device=device)
        self.seen = seen_flags(prompt, size, device) if repetition != 1.0 else None  # [V] bool
        self.counts = torch.zeros(size, device=device) if presence or frequency else None  # [V] fp32 occurrences

    @classmethod
    def of(cls, params, size: int, device: torch.device, prompt: Iterable[int] = ()) -> "Penalties | None":
        """The tables of params' logit_bias (a mapping or (id, bias) pairs) and repetition / presence / frequency
        penalties (SamplingParams' or the server's Params' fields); None when none changes a logit."""
        if not shapes_logits(params):
            return None
        return cls(size, device, repetition=params.repetition_penalty, presence=params.presence_penalty,
                   frequency=params.frequency_penalty, bias=dict(params.logit_bias), prompt=prompt)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [V] fp32 -> shaped: bias, then the repetition penalty, then presence and frequency."""
        shaped = logits.clone()
        self.apply_(shaped)
        return shaped

    def apply_(self, logits: torch.Tensor) -> None:
        """__call__ in place."""
        if self.bias is not None:
            logits += self.bias
        if self.seen is not None:
            logits.copy_(penalize_repeats(logits, self.seen, self.repetition))
        if self.counts is not None:
            logits -= (self.counts > 0) * self.presence + self.counts * self.frequency

    def accept(self, token: int) -> None:
        """The token chosen at this step joins the history."""
        if self.seen is not None:
            self.seen[token] = True
        if self.counts is not None:
            self.counts[token] += 1
