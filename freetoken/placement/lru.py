"""Global LRU over (layer, expert) keys across all layers: FreeToken's expert cache."""

from __future__ import annotations

from freetoken.placement.policy import PlacementPolicy


class LRU(PlacementPolicy):
    """The recency order is slot_of's own insertion order (least recently used first): an admitted key is
    inserted at the back, an evicted one popped, a hit moved to the back. No second structure to keep in step."""

    name = "lru"

    def on_hit(self, key: int, now: int) -> None:
        slot_of = self.slot_of
        slot_of[key] = slot_of.pop(key)

    def victim(self, key: int, now: int, protected: set[int]) -> int | None:
        for k in self.slot_of:  # keys of the current call sit at the back: this stops at once unless all are
            if k not in protected:
                return k
        return None
