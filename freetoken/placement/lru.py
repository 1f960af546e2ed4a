"""Global LRU over (layer, expert) keys across all layers: FreeToken's expert cache."""

from __future__ import annotations

from freetoken.placement.policy import PlacementPolicy


class LRU(PlacementPolicy):
    name = "lru"

    def __init__(self, capacity: int, num_layers: int, num_experts: int):
        super().__init__(capacity, num_layers, num_experts)
        self._order: dict[int, None] = {}  # resident keys, least recently used first

    def on_hit(self, key: int, now: int) -> None:
        order = self._order
        del order[key]
        order[key] = None

    def on_admit(self, key: int, now: int) -> None:
        self._order[key] = None

    def on_evict(self, key: int) -> None:
        del self._order[key]

    def victim(self, key: int, now: int, protected: set[int]) -> int | None:
        for k in self._order:  # keys of the current call sit at the back: this stops at once unless all are
            if k not in protected:
                return k
        return None
