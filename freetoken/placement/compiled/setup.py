"""What a compiled policy module's `setup(capacity, num_layers, num_experts, **options)` returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Setup:
    """state: the policy's own arrays (a tuple, passed to every hook as `p`); pinned: keys resident before the
    first call, given slots 0, 1, ... in this order; admits: False = residency is fixed (fetches use staging);
    orders_admission: fetched keys are offered slots after the call's accesses, in hooks.admission_order;
    prefetches: hooks.prefetch_for is called after each call; stream: a file of this package whose replay_calls
    replays a CallStream for this policy (and these options) faster than the generic driver, with equal results."""

    state: tuple
    pinned: tuple = ()
    admits: bool = True
    orders_admission: bool = False
    prefetches: bool = False
    stream: str | None = None
