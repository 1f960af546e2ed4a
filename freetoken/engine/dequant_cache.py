"""A bounded cache of dequantized CPU-lane experts: a packed (int4 / fp8 / fp4) expert the CPU lane computes is
dequantized once and kept while it stays among the most recently used that fit the byte budget, instead of being
dequantized on every use (0.4-0.9 s per Qwen3-30B-A3B expert here). Hot CPU experts repeat across steps, so the
CPU lane then reads plain weights at memory speed."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

import torch

DEFAULT_BUDGET_BYTES = 1 << 30  # 1 GiB of host memory


class DequantCache:
    """LRU over (layer, expert) -> (gate_up [2I, D], down [D, I]); total bytes never exceed `budget_bytes` (an
    expert larger than the budget is returned, not kept). Thread-safe: the CPU lane runs on a worker thread."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES):
        if budget_bytes < 0:
            raise ValueError(f"cpu dequant cache budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.bytes = 0
        self.hits = self.misses = 0
        self._entries: OrderedDict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[int, int], make: Callable[[], tuple[torch.Tensor, torch.Tensor]]):
        with self._lock:
            got = self._entries.get(key)
            if got is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return got
        value = make()  # outside the lock: the slow part
        size = sum(t.numel() * t.element_size() for t in value)
        with self._lock:
            self.misses += 1
            if size > self.budget_bytes or key in self._entries:
                return value
            while self.bytes + size > self.budget_bytes:
                _, old = self._entries.popitem(last=False)
                self.bytes -= sum(t.numel() * t.element_size() for t in old)
            self._entries[key] = value
            self.bytes += size
        return value

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
