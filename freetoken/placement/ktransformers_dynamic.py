"""KTransformers' dynamic expert update: a pinned set (a placement strategy's) re-pinned from recent routing counts.

Demand misses never take a slot (they run from staging or on the CPU, as `frequency`); residency changes only when
the policy re-pins, by prefetching the new set's missing keys into the slots of the old set's leavers:
    every `window` forward passes (calls of the last MoE layer), the fair frequency rule (frequency.pinned_keys,
        per_layer) over the token-weighted counts since the last re-pin; the counts then restart;
    after a long prefill call (at least `prefill_pairs` routed (token, expert) pairs), that layer alone keeps its
        slot count and re-pins its top experts by the call's own counts (KTransformers' layerwise prefill update).
Scores are 2 * count + 1 for a resident key, so equal counts keep what is resident (no churn), then the lower key.
Leavers go coldest first, newcomers hottest first; a leaver the current call uses is kept this round.
"""

from __future__ import annotations

import numpy as np

from freetoken.placement.call import PREFILL, Call
from freetoken.placement.frequency import pinned_keys, strategy_keys
from freetoken.placement.policy import PlacementPolicy


def repin_target(score: np.ndarray, capacity: int, num_layers: int, num_experts: int) -> list[int]:
    """The fair frequency rule over [L*E] scores."""
    return pinned_keys(score.reshape(num_layers, num_experts), capacity, "per_layer")


def layer_target(score: np.ndarray, n: int) -> list[int]:
    """Top n of one layer's [E] scores (ties to the lower expert)."""
    return [int(e) for e in np.lexsort((np.arange(score.size), -score))[:n]]


class KTransformersDynamic(PlacementPolicy):
    name = "ktransformers_dynamic"

    @staticmethod
    def needs_profile(options: dict) -> bool:
        """Whether these constructor options read the profile (the cache config then requires one)."""
        return options.get("strategy", "uniform") == "frequency"

    def __init__(self, capacity: int, num_layers: int, num_experts: int, profile: np.ndarray | None = None,
                 strategy: str = "uniform", window: int = 32, prefill_pairs: int = 1024):
        super().__init__(capacity, num_layers, num_experts)
        if window < 1:
            raise ValueError(f"ktransformers_dynamic window must be >= 1 forward pass, got {window}")
        if prefill_pairs < 1:
            raise ValueError(f"ktransformers_dynamic prefill_pairs must be >= 1, got {prefill_pairs}")
        from freetoken.placement.frequency import Frequency

        Frequency(capacity, num_layers, num_experts, profile, "per_layer", strategy)  # validates the options
        self._place_pinned(strategy_keys(strategy, profile, capacity, num_layers, num_experts, "per_layer"))
        self.window, self.prefill_pairs = window, prefill_pairs
        self.recent = np.zeros(num_layers * num_experts, np.int64)  # [L*E] tokens routed since the last re-pin
        self.passes = 0
        self.leavers: list[int] = []

    def begin_call(self, keys: list[int]) -> None:
        self.leavers = []

    def victim(self, key: int, now: int, protected: set[int]) -> int | None:
        while self.leavers:  # only a re-pin's prefetch finds leavers; a demand miss finds none
            out = self.leavers.pop(0)
            if out in self.slot_of and out not in protected:
                return out
        return None

    def _resident_bonus(self, keys) -> np.ndarray:
        return np.array([1 if k in self.slot_of else 0 for k in keys], np.int64)

    def prefetch_for(self, call: Call) -> list[int]:
        L, E = self.num_layers, self.num_experts
        base = call.layer * E
        for e, t in zip(call.experts, call.tokens):
            self.recent[base + e] += t
        if call.phase == PREFILL and sum(call.tokens) >= self.prefill_pairs:
            keys = range(base, base + E)
            counts = np.zeros(E, np.int64)
            for e, t in zip(call.experts, call.tokens):
                counts[e] += t
            score = 2 * counts + self._resident_bonus(keys)  # [E]
            held = sum(1 for k in keys if k in self.slot_of)
            target = {base + e for e in layer_target(score, held)}
            keys = np.arange(base, base + E)
        elif call.layer == L - 1:
            self.passes += 1
            if self.passes < self.window:
                return []
            self.passes = 0
            keys = np.arange(L * E)
            score = 2 * self.recent + self._resident_bonus(keys)  # [L*E]
            target = set(repin_target(score, self.capacity, L, E))
            self.recent[:] = 0
        else:
            return []
        order = np.lexsort((keys, score))  # coldest first, ties to the lower key
        self.leavers = [int(keys[i]) for i in order if int(keys[i]) in self.slot_of and int(keys[i]) not in target]
        hottest = np.lexsort((keys, -score))
        return [int(keys[i]) for i in hottest if int(keys[i]) in target and int(keys[i]) not in self.slot_of]
