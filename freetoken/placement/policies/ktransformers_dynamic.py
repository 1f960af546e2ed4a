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

from typing import NamedTuple

import numpy as np

from freetoken.placement.call import PREFILL, Call
from freetoken.placement.compiled.cache import jit
from freetoken.placement.compiled.core import is_protected
from freetoken.placement.compiled.form import Compiled, Setup
from freetoken.placement.compiled.order import stable_order
from freetoken.placement.policies.frequency import pinned_keys, strategy_keys
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
        from freetoken.placement.policies.frequency import Frequency

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


# ── compiled: the same decision on arrays (freetoken/placement/compiled) ─────────────────────────────────────────────
# The counts are taken in begin_call (the reference takes them in prefetch_for; nothing reads them in between), the
# leavers are an array walked by a pointer. Scores, the target mask and the sort buffers are in the state (hooks
# allocate nothing); stable_order is the reference's lexsort by (-score, key) or (score, key).

class State(NamedTuple):
    recent: np.ndarray  # int64 [K] (recent)
    passes: np.ndarray  # int64 [1] (passes)
    leavers: np.ndarray  # int64 [K] (leavers: leavers[next_leaver[0]:n_leavers[0]])
    next_leaver: np.ndarray  # int64 [1]
    n_leavers: np.ndarray  # int64 [1]
    counts: np.ndarray  # int64 [E] the call's tokens per expert
    call_pairs: np.ndarray  # int64 [1] the call's (token, expert) pairs, and its phase
    call_phase: np.ndarray  # int64 [1]
    score: np.ndarray  # int64 [K] scratch: the scores, the target mask, a sort's order and its buffer
    target: np.ndarray  # int64 [K]
    order: np.ndarray  # int64 [K]
    tmp: np.ndarray  # int64 [K]
    window: int
    prefill_pairs: int
    num_layers: int
    num_experts: int
    capacity: int


def setup(capacity: int, num_layers: int, num_experts: int, **options) -> Setup:
    reference = KTransformersDynamic(capacity, num_layers, num_experts, **options)  # its checks and start
    pinned = sorted(reference.slot_of, key=reference.slot_of.__getitem__)
    K, z = num_layers * num_experts, np.zeros
    state = State(z(K, np.int64), z(1, np.int64), z(K, np.int64), z(1, np.int64), z(1, np.int64),
                  z(num_experts, np.int64), z(1, np.int64), z(1, np.int64), z(K, np.int64), z(K, np.int64),
                  z(K, np.int64), z(K, np.int64), reference.window, reference.prefill_pairs, num_layers, num_experts,
                  capacity)
    return Setup(state, tuple(pinned), prefetches=True)


def begin_call(p, st, c, keys, tokens, phase):
    p.n_leavers[0] = p.next_leaver[0] = 0
    E = p.num_experts
    p.counts[:] = 0
    pairs = 0
    for i in range(keys.size):
        p.recent[keys[i]] += tokens[i]
        p.counts[keys[i] % E] += tokens[i]
        pairs += tokens[i]
    p.call_pairs[0], p.call_phase[0] = pairs, phase


def victim(p, st, key, now):
    while p.next_leaver[0] < p.n_leavers[0]:  # only a re-pin's prefetch finds leavers; a demand miss finds none
        out = p.leavers[p.next_leaver[0]]
        p.next_leaver[0] += 1
        if st.slot_of[out] >= 0 and not is_protected(st, out):
            return out
    return -1


@jit
def _repin_target(p):
    """frequency.pinned_keys(per_layer) over score [K] as the mask target [K] (repin_target)."""
    L, E = p.num_layers, p.num_experts
    p.target[:] = 0
    n = min(p.capacity // L, E)
    for layer in range(L):
        stable_order(p.score, layer * E, E, True, p.order, p.tmp)
        for j in range(n):
            p.target[layer * E + p.order[j]] = 1
    left = p.capacity - n * L
    stable_order(p.score, 0, L * E, True, p.order, p.tmp)
    for j in range(L * E):
        if left <= 0:
            break
        k = p.order[j]
        if p.target[k] == 0:
            p.target[k] = 1
            left -= 1


def prefetch_for(p, st, c, keys, out):
    L, E, slot_of = p.num_layers, p.num_experts, st.slot_of
    if keys.size == 0:
        return 0
    base = (keys[0] // E) * E
    if p.call_phase[0] == PREFILL and p.call_pairs[0] >= p.prefill_pairs:  # this layer, by the call's counts
        n_keys = E
        held = 0
        for e in range(E):
            resident = 1 if slot_of[base + e] >= 0 else 0
            held += resident
            p.score[e] = 2 * p.counts[e] + resident
            p.target[e] = 0
        stable_order(p.score, 0, E, True, p.order, p.tmp)
        for j in range(held):  # layer_target
            p.target[p.order[j]] = 1
    elif base // E == L - 1:  # a forward pass ends
        p.passes[0] += 1
        if p.passes[0] < p.window:
            return 0
        p.passes[0] = 0
        base, n_keys = 0, L * E
        for k in range(n_keys):
            p.score[k] = 2 * p.recent[k] + (1 if slot_of[k] >= 0 else 0)
        _repin_target(p)
        p.recent[:] = 0
    else:
        return 0
    stable_order(p.score, 0, n_keys, False, p.order, p.tmp)  # coldest first
    n = 0
    for j in range(n_keys):
        i = p.order[j]
        if slot_of[base + i] >= 0 and p.target[i] == 0:
            p.leavers[n] = base + i
            n += 1
    p.n_leavers[0], p.next_leaver[0] = n, 0
    stable_order(p.score, 0, n_keys, True, p.order, p.tmp)  # hottest first
    m = 0
    for j in range(n_keys):
        i = p.order[j]
        if p.target[i] != 0 and slot_of[base + i] < 0:
            out[m] = base + i
            m += 1
    return m


KTransformersDynamic.compiled = Compiled("ktransformers_dynamic", State, setup, dict(
    begin_call=begin_call, victim=victim, prefetch_for=prefetch_for))
