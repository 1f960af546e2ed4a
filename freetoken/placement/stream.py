"""Key streams: the sequence of calls as (layer, expert) keys, for offline policies and stack-distance analysis."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from freetoken.placement.call import Call

NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True, slots=True)
class KeyStream:
    """keys [N]: every access, call after call, in call order; offsets [C + 1]: call c is keys[offsets[c]:offsets[c+1]]."""

    keys: np.ndarray  # [N] int64
    offsets: np.ndarray  # [C + 1] int64

    @property
    def num_calls(self) -> int:
        return len(self.offsets) - 1

    def call_ids(self) -> np.ndarray:
        """[N]: the call each access belongs to."""
        return np.repeat(np.arange(self.num_calls, dtype=np.int64), np.diff(self.offsets))


def key_stream(calls: Iterable[Call], num_experts: int) -> KeyStream:
    keys: list[int] = []
    offsets = [0]
    for call in calls:
        base = call.layer * num_experts
        keys.extend(base + e for e in call.experts)
        offsets.append(len(keys))
    return KeyStream(np.asarray(keys, np.int64), np.asarray(offsets, np.int64))


def next_occurrence(keys: np.ndarray) -> np.ndarray:
    """[N] -> [N]: index of the next access to the same key, NEVER if none."""
    keys = np.asarray(keys, np.int64)
    n = keys.size
    order = np.argsort(keys, kind="stable")  # grouped by key, in time order
    nxt = np.full(n, NEVER, np.int64)
    same = keys[order[1:]] == keys[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


def previous_occurrence(keys: np.ndarray) -> np.ndarray:
    """[N] -> [N]: index of the previous access to the same key, -1 if none."""
    keys = np.asarray(keys, np.int64)
    n = keys.size
    order = np.argsort(keys, kind="stable")
    prev = np.full(n, -1, np.int64)
    same = keys[order[1:]] == keys[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    return prev
