"""The placement-policy interface: one object decides residency for the simulator and the live engine alike.

A policy owns which (layer, expert) keys hold one of `capacity` GPU slots. Keys are ints,
key = layer * num_experts + expert. A subclass is small: it overrides a few hooks (libCacheSim style),
and `plan` turns each Call into a Plan the same way for every policy:

    1. hit/miss status of every expert of the call (fixed at the start of the call);
    2. the split picks which misses to fetch; the rest go to the CPU lane;
    3. accesses are applied in call order: on_hit / on_miss, then fetched keys are offered for a slot.
       Keys of the current call are never evicted for each other (the GPU needs them all at once);
       a fetched key that finds no slot runs from a staging buffer (slot -1) and is not kept.
       A policy that overrides admission_order() is offered the slots after all the call's accesses, in
       the order it gives (Belady: soonest next use first).

So a call is one *set* access: for LRU its keys become most recent together, in call order. With one
expert per call (top-1) this is exactly a sequential cache over the key stream (libCacheSim's model);
with top-k > 1 it differs from a sequential cache only where one of the call's own keys would be evicted.

Prefetch: after the call's own accesses, `prefetch_for(call)` may name keys of later layers to copy ahead of
need. Each one not yet resident is admitted through the same victim() path (never evicting the current call's
keys, nor a key prefetched earlier in the same call); one that finds no slot is not copied. They land in
Plan.prefetch (slots: `slot_of` after the plan) and their evictions in Plan.evict. A prefetch is no access:
it moves no clock and calls on_prefetch, not on_hit / on_miss. The default prefetches nothing.
"""

from __future__ import annotations

from freetoken.placement.call import PREFILL, Call, Plan
from freetoken.placement.split import Split

NOT_RESIDENT = -1


def check_size(capacity: int, num_layers: int, num_experts: int) -> None:
    if num_layers <= 0 or num_experts <= 0:
        raise ValueError(f"num_layers and num_experts must be positive, got {num_layers}, {num_experts}")
    if not 0 <= capacity <= num_layers * num_experts:
        raise ValueError(f"capacity must lie in [0, {num_layers * num_experts}] expert slots "
                         f"({num_layers} layers x {num_experts} experts), got {capacity}")


class PlacementPolicy:
    name = "base"
    admits = True  # False: residency is fixed (pinned); fetched experts are used once from staging
    needs_future = False  # True: offline policy that must be given the whole future key stream

    def __init__(self, capacity: int, num_layers: int, num_experts: int):
        check_size(capacity, num_layers, num_experts)
        self.capacity = capacity
        self.num_layers = num_layers
        self.num_experts = num_experts
        self.slot_of: dict[int, int] = {}  # key -> slot
        self._free_slots = list(range(capacity - 1, -1, -1))
        self.clock = 0  # accesses applied so far
        self.last_use = [-1] * (num_layers * num_experts)  # clock of each key's latest access
        cls = type(self)  # hooks left as the base's no-ops are skipped on the hot path of every replay
        self._hooks = tuple(getattr(self, h) if getattr(cls, h) is not getattr(PlacementPolicy, h) else None
                            for h in ("on_hit", "on_miss", "on_admit", "on_evict"))
        self._prefetches = cls.prefetch_for is not PlacementPolicy.prefetch_for
        self._orders_admission = cls.admission_order is not PlacementPolicy.admission_order

    def _place_pinned(self, keys) -> None:
        """Warm start for static policies: give these keys slots before the first call."""
        for key in keys:
            self.slot_of[key] = self._free_slots.pop()

    # hooks
    def on_hit(self, key: int, now: int) -> None:
        pass

    def on_miss(self, key: int, now: int) -> None:
        pass

    def on_admit(self, key: int, now: int) -> None:
        pass

    def on_evict(self, key: int) -> None:
        pass

    def begin_call(self, keys: list[int]) -> None:
        """Called with the call's keys before any of them is applied."""

    def admission_order(self, keys: list[int]) -> list[int]:
        """The call's fetched keys in the order they are offered a slot (overridden: after all the call's
        accesses, e.g. soonest-needed first so a free slot never goes to a key the call's others outrank).
        The base never calls this: its fetched keys are offered a slot one by one, in call order."""
        return keys

    def prefetch_for(self, call: Call) -> list[int]:
        """Keys to copy ahead of need once this call's own accesses are applied, most wanted first."""
        return []

    def on_prefetch(self, key: int, now: int) -> None:
        """`key` was just given a slot by a prefetch (after on_admit)."""

    def victim(self, key: int, now: int, protected: set[int]) -> int | None:
        """A resident key, not in `protected`, to evict so that `key` gets a slot; None = do not cache `key`."""
        raise NotImplementedError

    # shared
    def plan(self, call: Call, split: Split) -> Plan:
        E = self.num_experts
        base = call.layer * E
        experts = call.experts
        keys = [base + e for e in experts]
        self.begin_call(keys)
        get = self.slot_of.get
        last_use = self.last_use
        tokens = call.tokens
        slots, hits, hit_slots = [], [], []  # hit/miss status is fixed at the call's start
        miss_idx, miss_experts, miss_tokens, miss_last = [], [], [], []
        for i, key in enumerate(keys):  # one plain loop: comprehensions cost a frame each on this hot path
            slot = get(key)
            slots.append(slot)
            if slot is None:
                miss_idx.append(i)
                miss_experts.append(experts[i])
                miss_tokens.append(tokens[i])
                miss_last.append(last_use[key])
            else:
                hits.append(experts[i])
                hit_slots.append(slot)
        fetch, fetch_slots, cpu, evict = [], [], [], []
        chosen = ()
        if miss_idx:
            picks = split.choose(miss_experts, miss_tokens, miss_last)
            chosen = {miss_idx[j] for j in picks} if len(picks) < len(miss_idx) else set(miss_idx)
        protected = None  # the call's keys, built when a fetch first needs a victim
        on_hit, on_miss, on_admit, on_evict = self._hooks
        slot_of, free, victim = self.slot_of, self._free_slots, self.victim
        admits = self.admits and self.capacity > 0 and (split.admit_prefill or call.phase != PREFILL)
        now = self.clock
        deferred = [] if self._orders_admission and admits else None  # (key, fetch index, clock) to admit
        for i, key in enumerate(keys):  # accesses apply in call order
            if slots[i] is not None:  # still resident: the call's keys are protected from each other
                if on_hit is not None:
                    on_hit(key, now)
            else:
                if on_miss is not None:
                    on_miss(key, now)
                if i in chosen:
                    fetch.append(experts[i])
                    slot = NOT_RESIDENT  # admit: a free slot, else the victim's, else staging (not kept)
                    if deferred is not None:
                        deferred.append((key, len(fetch_slots), now))
                    elif admits:
                        if free:
                            slot = free.pop()
                        else:
                            if protected is None:
                                protected = set(keys)
                            out = victim(key, now, protected)
                            if out is not None:
                                slot = slot_of.pop(out)
                                if on_evict is not None:
                                    on_evict(out)
                                evict.append(divmod(out, E))
                        if slot != NOT_RESIDENT:
                            slot_of[key] = slot
                            if on_admit is not None:
                                on_admit(key, now)
                    fetch_slots.append(slot)
                else:
                    cpu.append(experts[i])
            last_use[key] = now
            now += 1
        self.clock = now
        if deferred:
            self._admit_in_order(deferred, set(keys), fetch_slots, evict)
        prefetch = self._prefetch(self.prefetch_for(call), set(keys), evict) if self._prefetches else []
        return Plan(call.layer, hits, hit_slots, fetch, fetch_slots, cpu, evict, prefetch)

    def _admit_in_order(self, deferred: list[tuple[int, int, int]], protected: set[int], fetch_slots: list[int],
                        evict: list) -> None:
        """Offer the call's fetched keys a slot in admission_order(); fills their fetch_slots entries."""
        where = {key: (j, t) for key, j, t in deferred}
        E = self.num_experts
        for key in self.admission_order([key for key, _, _ in deferred]):
            j, t = where[key]
            slot = NOT_RESIDENT
            if self._free_slots:
                slot = self._free_slots.pop()
            else:
                out = self.victim(key, t, protected)
                if out is not None:
                    slot = self.slot_of.pop(out)
                    self.on_evict(out)
                    evict.append(divmod(out, E))
            if slot != NOT_RESIDENT:
                self.slot_of[key] = slot
                self.on_admit(key, t)
            fetch_slots[j] = slot

    def _prefetch(self, wanted: list[int], protected: set[int], evict: list) -> list[tuple[int, int]]:
        """Admit each wanted key that is not resident: a free slot, else the victim's, else it is not copied."""
        if not (self.admits and self.capacity):
            return []
        done, now, E = [], self.clock, self.num_experts
        for key in wanted:
            if key in self.slot_of or key in protected:
                continue
            if self._free_slots:
                slot = self._free_slots.pop()
            else:
                out = self.victim(key, now, protected)
                if out is None:
                    continue
                slot = self.slot_of.pop(out)
                self.on_evict(out)
                evict.append(divmod(out, E))
            self.slot_of[key] = slot
            self.on_admit(key, now)
            self.on_prefetch(key, now)
            protected.add(key)
            done.append(divmod(key, E))
        return done

    # inspection
    def resident(self) -> dict[tuple[int, int], int]:
        """(layer, expert) -> slot of every resident expert."""
        return {divmod(k, self.num_experts): s for k, s in self.slot_of.items()}

    def slot(self, layer: int, expert: int) -> int:
        return self.slot_of.get(layer * self.num_experts + expert, NOT_RESIDENT)
