"""MoE-Infinity's activation-aware prefetch and eviction on the one policy interface.

A sequence (one prompt's prefill and the decode after it: it starts at a layer-0 prefill call after a decode call)
builds its expert activation matrix (EAM): tokens routed to each (layer, expert) so far. Finished sequences' EAMs
are kept in a ring of `library` rows, seeded with `past` [R, L*E] (MoE-Infinity collects them offline from a
dataset: activation_matrices(profile trace); the last `library` rows are kept). After each call the current EAM
is matched to the past one of highest cosine similarity (exact integer dot products, ties to the lower row; no
match when none overlaps), whose counts then
    prefetch: for the next `depth` layers of the sweep, their `width` most used experts in the match (count > 0),
        nearest layer first, hottest first;
    evict:    the resident, unprotected key of the lowest matched count, then the least recent, then the lower key
              (with no match: plain LRU).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from freetoken.placement.call import DECODE, PREFILL, Call
from freetoken.placement.compiled.core import is_protected
from freetoken.placement.compiled.form import Compiled, Setup
from freetoken.placement.compiled.order import stable_order
from freetoken.placement.policy import PlacementPolicy


def check_options(library: int, depth: int, width: int) -> None:
    if library < 1:
        raise ValueError(f"moe_infinity library must be >= 1 past sequence, got {library}")
    if depth < 0:
        raise ValueError(f"moe_infinity depth must be >= 0 layers, got {depth}")
    if width < 0:
        raise ValueError(f"moe_infinity width must be >= 0 experts per layer, got {width}")


def activation_matrices(trace) -> np.ndarray:
    """[R, L*E]: tokens routed to each (layer, expert) by each request of a RoutingTrace, in request order."""
    L, E = trace.num_layers, trace.num_experts
    requests = np.unique(trace.request)
    out = np.zeros((len(requests), L * E), np.int64)
    keys = trace.experts.astype(np.int64) + (np.arange(L) * E)[None, :, None]  # [T, L, K]
    row = np.searchsorted(requests, trace.request)  # [T]
    np.add.at(out, (np.repeat(row, keys.shape[1] * keys.shape[2]), keys.reshape(-1)), 1)
    return out


def seed_ring(past, library: int, num_keys: int) -> tuple[np.ndarray, int, int]:
    """(ring [library, K], rows stored, next row) holding the last `library` rows of past [R, K]."""
    ring = np.zeros((library, num_keys), np.int64)
    if past is None:
        return ring, 0, 0
    past = np.asarray(past, np.int64).reshape(len(past), -1)
    if past.shape[1] != num_keys:
        raise ValueError(f"moe_infinity past must have {num_keys} columns (layers x experts), got {past.shape[1]}")
    rows = past[-library:]
    ring[:len(rows)] = rows
    return ring, len(rows), len(rows) % library


def best_match(current: np.ndarray, past: np.ndarray) -> int:
    """Row of past [R, K] most cosine-similar to current [K]; -1 when no row overlaps it."""
    best, best_sim = -1, 0.0
    norm = math.sqrt(float(int(current @ current)))
    for r in range(past.shape[0]):
        dot = int(past[r] @ current)
        if dot == 0:
            continue
        sim = dot / (norm * math.sqrt(float(int(past[r] @ past[r]))))
        if sim > best_sim:
            best, best_sim = r, sim
    return best


class MoEInfinity(PlacementPolicy):
    name = "moe_infinity"

    def __init__(self, capacity: int, num_layers: int, num_experts: int, library: int = 64, depth: int = 1,
                 width: int = 2, past: np.ndarray | None = None):
        super().__init__(capacity, num_layers, num_experts)
        check_options(library, depth, width)
        K = num_layers * num_experts
        self.depth, self.width = depth, width
        self.current = np.zeros(K, np.int64)  # [K] this sequence's EAM
        self.past, self.stored, self.next_row = seed_ring(past, library, K)  # [R, K] ring of finished EAMs
        self.predicted = np.zeros(K, np.int64)  # [K] the matched EAM (zeros: no match)
        self.previous_phase = DECODE

    def victim(self, key: int, now: int, protected: set[int]) -> int | None:
        pred, last = self.predicted.tolist(), self.last_use  # (Python ints: numpy scalars compare ~5x slower)
        return min((k for k in self.slot_of if k not in protected), key=lambda k: (pred[k], last[k], k), default=None)

    def prefetch_for(self, call: Call) -> list[int]:
        E = self.num_experts
        if call.phase == PREFILL and call.layer == 0 and self.previous_phase == DECODE:  # a new sequence
            if self.current.any():
                self.past[self.next_row] = self.current
                self.next_row = (self.next_row + 1) % self.past.shape[0]
                self.stored = min(self.stored + 1, self.past.shape[0])
            self.current[:] = 0
        self.previous_phase = call.phase
        for e, t in zip(call.experts, call.tokens):
            self.current[call.layer * E + e] += t
        row = best_match(self.current, self.past[:self.stored])
        if row < 0:
            self.predicted[:] = 0
            return []
        self.predicted[:] = self.past[row]
        wanted = []
        for layer in range(call.layer + 1, min(call.layer + 1 + self.depth, self.num_layers)):
            counts = self.predicted[layer * E:(layer + 1) * E]  # [E]
            for e in np.lexsort((np.arange(E), -counts))[:self.width]:
                if counts[e] > 0:
                    wanted.append(int(layer * E + e))
        return wanted


# ── compiled: the same decision on arrays (freetoken/placement/compiled) ─────────────────────────────────────────────
# The sequence boundary and the counts are taken in begin_call, the match in prefetch_for (the reference does both in
# prefetch_for; nothing reads the current EAM in between). stable_order is the reference's lexsort by (-count, e).

class State(NamedTuple):
    current: np.ndarray  # int64 [K] (current)
    past: np.ndarray  # int64 [library, K] (past, a ring)
    stored: np.ndarray  # int64 [1] (stored)
    next_row: np.ndarray  # int64 [1] (next_row)
    predicted: np.ndarray  # int64 [K] (predicted)
    previous_phase: np.ndarray  # int64 [1] (previous_phase)
    order: np.ndarray  # int64 [E] a sort's order and its buffer
    tmp: np.ndarray  # int64 [E]
    depth: int
    width: int
    num_layers: int
    num_experts: int


def setup(capacity: int, num_layers: int, num_experts: int, library: int = 64, depth: int = 1, width: int = 2,
          past=None) -> Setup:
    check_options(library, depth, width)
    K, z = num_layers * num_experts, np.zeros
    ring, stored, next_row = seed_ring(past, library, K)
    state = State(z(K, np.int64), ring, np.array([stored]), np.array([next_row]), z(K, np.int64),
                  np.array([DECODE]), z(num_experts, np.int64), z(num_experts, np.int64), depth, width, num_layers,
                  num_experts)
    return Setup(state, prefetches=True)


def begin_call(p, st, c, keys, tokens, phase):
    E = p.num_experts
    if keys.size > 0 and phase == PREFILL and keys[0] // E == 0 and p.previous_phase[0] == DECODE:  # a new sequence
        used = False
        for k in range(p.current.size):
            if p.current[k] != 0:
                used = True
                break
        if used:
            row = p.next_row[0]
            for k in range(p.current.size):
                p.past[row, k] = p.current[k]
            p.next_row[0] = (row + 1) % p.past.shape[0]
            p.stored[0] = min(p.stored[0] + 1, p.past.shape[0])
        p.current[:] = 0
    p.previous_phase[0] = phase
    for i in range(keys.size):
        p.current[keys[i]] += tokens[i]


def victim(p, st, key, now):
    """The lowest matched count, then the least recent, then the lower key."""
    best = -1
    for s in range(st.key_of_slot.size):
        k = st.key_of_slot[s]
        if k < 0 or is_protected(st, k):
            continue
        if best < 0 or (p.predicted[k], st.last_use[k], k) < (p.predicted[best], st.last_use[best], best):
            best = k
    return best


def prefetch_for(p, st, c, keys, out):
    """best_match, then the next `depth` layers' `width` most used experts of the match."""
    K, E = p.current.size, p.num_experts
    best, best_sim = -1, 0.0
    own = 0
    for k in range(K):
        own += p.current[k] * p.current[k]
    norm = math.sqrt(float(own))
    for r in range(p.stored[0]):
        dot = sq = 0
        for k in range(K):
            dot += p.past[r, k] * p.current[k]
            sq += p.past[r, k] * p.past[r, k]
        if dot == 0:
            continue
        sim = dot / (norm * math.sqrt(float(sq)))
        if sim > best_sim:
            best, best_sim = r, sim
    if best < 0:
        p.predicted[:] = 0
        return 0
    for k in range(K):
        p.predicted[k] = p.past[best, k]
    if keys.size == 0:  # no layer to predict from
        return 0
    layer = keys[0] // E
    n = 0
    for nxt in range(layer + 1, min(layer + 1 + p.depth, p.num_layers)):
        stable_order(p.predicted, nxt * E, E, True, p.order, p.tmp)
        for j in range(min(p.width, E)):
            e = p.order[j]
            if p.predicted[nxt * E + e] > 0:
                out[n] = nxt * E + e
                n += 1
    return n


MoEInfinity.compiled = Compiled("moe_infinity", State, setup, dict(begin_call=begin_call, victim=victim,
                                                                    prefetch_for=prefetch_for))
