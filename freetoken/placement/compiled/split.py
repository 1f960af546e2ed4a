"""The miss split in compiled code: freetoken.placement.split.Split as a float64 [8] array, same decisions."""

from __future__ import annotations

import functools

import numpy as np

from freetoken.placement.compiled.cache import jit
from freetoken.placement.split import FETCH_ORDERS, Split

MODES = ("offload", "cpu", "hybrid")
RULES = ("balanced", "paper", "max_fetch")
ORDERS = tuple(FETCH_ORDERS)  # most_tokens, most_recent, lowest_id


@functools.lru_cache(maxsize=64)
def split_array(split: Split) -> np.ndarray:
    """[mode, rule, bp, bh, max_fetch, fetch_order, fetch_min_pairs, admit_prefill]."""
    a = np.array([MODES.index(split.mode), RULES.index(split.rule), split.bp, split.bh, split.max_fetch,
                  ORDERS.index(split.fetch_order), split.fetch_min_pairs, split.admit_prefill], np.float64)
    a.flags.writeable = False
    return a


@jit
def fetch_count(split, m):
    """split.fetch_count(m): offload m, cpu 0, hybrid by its rule (balanced: integer argmin, ties to fewer)."""
    mode = int(split[0])
    if mode == 0:
        return m
    if mode == 1:
        return 0
    rule = int(split[1])
    bp, bh = split[2], split[3]
    if rule == 0:
        if m <= 0:
            return 0
        x = m * bp / (bp + bh)
        best_q, best_cost = -1, 0.0
        for q in (max(0, min(m, int(np.floor(x)))), max(0, min(m, int(np.ceil(x))))):
            cost = max(q / bp, (m - q) / bh)
            if best_q < 0 or cost < best_cost or (cost == best_cost and q < best_q):
                best_q, best_cost = q, cost
        return best_q
    if rule == 1:
        return max(0, min(m, int(np.rint(m * bp / bh))))  # round half to even, as Python's round
    return min(m, int(split[4]))


@jit
def choose(split, keys, tokens, last_use, miss, m, num_keys, kind, rank, order):
    """Marks kind[miss[j]] = 1 (fetch) for the misses the split fetches; the others stay 2 (cpu).
    miss[:m]: indices of the call's misses in call order; rank, order: [>= m] scratch. Ranks as split.FETCH_ORDERS
    (keys of one call share a layer, so key order is expert-id order)."""
    if m == 0:
        return
    q = -1
    pairs = int(split[6])
    if pairs > 0:
        total = 0
        for j in range(m):
            total += tokens[miss[j]]
        if total >= pairs:
            q = m
    if q < 0:
        q = fetch_count(split, m)
    if q == m:
        for j in range(m):
            kind[miss[j]] = 1
        return
    if q == 0:
        return
    by = int(split[5])
    for j in range(m):
        i = miss[j]
        if by == 0:
            rank[j] = -tokens[i] * num_keys + keys[i]
        elif by == 1:
            rank[j] = -last_use[keys[i]] * num_keys + keys[i]
        else:
            rank[j] = keys[i]
        b = j - 1  # insertion sort of order[:j + 1] by rank (ranks are distinct)
        while b >= 0 and rank[order[b]] > rank[j]:
            order[b + 1] = order[b]
            b -= 1
        order[b + 1] = j
    for j in range(q):
        kind[miss[order[j]]] = 1
