"""What one MoE layer asks of the cache, and what the cache answers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

PREFILL, DECODE = 0, 1
HIT, FETCH, CPU = 0, 1, 2  # per-expert kind codes of the compiled and device decisions


@dataclass(slots=True)
class Call:
    """One MoE-layer invocation: the distinct experts it needs, in first-use order.

    Decode calls carry one token's top-k; prefill calls carry every expert a chunk of tokens routes to,
    with how many of the chunk's tokens use each (the CPU lane's and the GPU's work scale with it).
    """

    layer: int
    experts: list[int]  # [A] distinct expert ids
    tokens: list[int]  # [A] tokens routed to each
    phase: int = DECODE
    request: int = 0


@dataclass(slots=True)
class Plan:
    """The policy's answer for one Call. Ids are expert ids within `layer`; evictions are (layer, expert).

    hits   experts already in a GPU slot (hit_slots: their slot ids)
    fetch  experts copied host -> GPU for this call (fetch_slots: the slot each lands in, -1 = a staging
           buffer, used once and not kept resident)
    cpu    experts the host computes
    evict  (layer, expert) pairs that lost their slot to make room for this call's fetches
    prefetch (layer, expert) pairs copied ahead of need for a later layer (kept resident)
    """

    layer: int
    hits: list[int]
    hit_slots: list[int]
    fetch: list[int]
    fetch_slots: list[int]
    cpu: list[int]
    evict: list[tuple[int, int]] = field(default_factory=list)
    prefetch: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_misses(self) -> int:
        return len(self.fetch) + len(self.cpu)

    @classmethod
    def from_kinds(cls, layer: int, experts: Sequence[int], kinds: Sequence[int], slots: Sequence[int],
                   evict_keys: Sequence[int] = (), prefetch_keys: Sequence[int] = (), num_experts: int = 1) -> Plan:
        """The Plan of the array form the compiled and device decisions write: kinds[i] (HIT / FETCH / CPU; a
        negative kind is padding of a fixed-width call and is skipped) and slots[i] of experts[i]; evicted and
        prefetched keys as layer * num_experts + expert."""
        hits, hit_slots, fetch, fetch_slots, cpu = [], [], [], [], []
        for e, k, s in zip(experts, kinds, slots):
            if k == HIT:
                hits.append(e)
                hit_slots.append(s)
            elif k == FETCH:
                fetch.append(e)
                fetch_slots.append(s)
            elif k == CPU:
                cpu.append(e)
        return cls(layer, hits, hit_slots, fetch, fetch_slots, cpu, [divmod(k, num_experts) for k in evict_keys],
                   [divmod(k, num_experts) for k in prefetch_keys])
