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

import numpy as np

from freetoken.placement.call import DECODE, PREFILL, Call
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
        pred, last = self.predicted, self.last_use
        best = None
        for k in self.slot_of:
            if k in protected:
                continue
            rank = (int(pred[k]), last[k], k)
            if best is None or rank < best:
                best = rank
        return None if best is None else best[2]

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
