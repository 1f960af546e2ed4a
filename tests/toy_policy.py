"""A placement policy added from outside the package, as docs/policies.md walks through: FIFO (evict the key admitted
longest ago; a hit does not refresh it). Reference class first, then its compiled half; tests/test_toy_policy.py
registers it and checks the two executors equal, Plan by Plan."""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from freetoken.placement import PlacementPolicy
from freetoken.placement.compiled.core import is_protected
from freetoken.placement.compiled.form import Compiled, Setup


class FIFO(PlacementPolicy):
    name = "fifo"

    def __init__(self, capacity: int, num_layers: int, num_experts: int):
        super().__init__(capacity, num_layers, num_experts)
        self.queue: OrderedDict[int, None] = OrderedDict()  # resident keys, the first admitted first

    def on_admit(self, key: int, now: int) -> None:
        self.queue[key] = None

    def on_evict(self, key: int) -> None:
        del self.queue[key]

    def victim(self, key: int, now: int, protected: set[int]) -> int | None:
        for k in self.queue:
            if k not in protected:
                return k
        return None


# ── compiled: the same decision on arrays ───────────────────────────────────────────────────────────────────────────
class State(NamedTuple):
    admitted: np.ndarray  # int64 [K] each resident key's place in the queue (its admission count)
    admissions: np.ndarray  # int64 [1] keys admitted so far


def setup(capacity: int, num_layers: int, num_experts: int) -> Setup:
    return Setup(State(np.zeros(num_layers * num_experts, np.int64), np.zeros(1, np.int64)))


def on_admit(p, key, now):
    p.admitted[key] = p.admissions[0]
    p.admissions[0] += 1


def victim(p, st, key, now):
    """The resident, unprotected key admitted first (queue order)."""
    best = -1
    for s in range(st.key_of_slot.size):
        k = st.key_of_slot[s]
        if k >= 0 and not is_protected(st, k) and (best < 0 or p.admitted[k] < p.admitted[best]):
            best = k
    return best


FIFO.compiled = Compiled("fifo", State, setup, dict(on_admit=on_admit, victim=victim))
