"""A policy's compiled half as one record: its State class, its setup() and its hooks (compiled/hooks.py).

A policy file ends with `Policy.compiled = Compiled(...)` (see docs/policies.md); make_policy then builds a
CompiledPolicy for the class. The driver is compiled per State, on first use, and cached per policy module.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np

from freetoken.placement.compiled.hooks import register
from freetoken.placement.compiled.notes import label


class Setup(NamedTuple):
    """What a policy's setup(capacity, num_layers, num_experts, **options) returns. state: its State; pinned: keys
    resident before the first call, given slots 0, 1, ... in this order; admits: False = residency is fixed (a fetch
    runs from staging); orders_admission: the call's fetched keys get slots after its accesses, in admission_order;
    prefetches: prefetch_for is called after each call; stream: Compiled.stream replays these options (else the
    driver)."""

    state: tuple
    pinned: tuple = ()
    admits: bool = True
    orders_admission: bool = False
    prefetches: bool = False
    stream: bool = False  # (a NamedTuple: built on every make_policy, 0.44 us against a frozen dataclass's 0.97)


@dataclass(frozen=True, eq=False)
class Compiled:
    """name: the policy's (or policies') name, for the cache and the compile note; state: the State class; setup:
    builds a Setup (validating options as the reference does); hooks: name -> function; stream: optional
    (policy, stream, split, c0, c1, log) -> sums, a replay of a CallStream faster than the driver's with its results
    (tests must show both equal)."""

    name: str
    state: type
    setup: Callable[..., Setup]
    hooks: dict = field(default_factory=dict)
    stream: Callable | None = None
    label: str | None = None  # what the compile note calls it (default: name)

    def __post_init__(self) -> None:
        register(self.state, self.hooks)

    @functools.cached_property
    def replay(self):
        """The driver's replay_calls for this State, a dispatcher of the policy module's own (cached per policy)."""
        from freetoken.placement.compiled.driver import entry

        return label(entry(self.state.__module__, self.name), self.label or self.name)

    def warm(self, policy) -> None:
        """Load or compile what `policy` runs, by replaying no call (its state does not change)."""
        from freetoken.placement.callstream import empty_stream
        from freetoken.placement.split import Split

        stream, log = empty_stream(policy.num_experts), np.zeros((10, 0), np.int64)
        policy.replay(stream, Split(), 0, 0, log, generic=True)
        if policy.own_stream:  # (a stream replay may compile offload's copy apart)
            for split in (Split(), Split("cpu")):
                policy.replay(stream, split, 0, 0, log)


class Pinned(NamedTuple):
    """The state of a policy whose residency is fixed at its start (static_layers, frequency): nothing to update."""

    keys: np.ndarray  # int64 [n] the resident keys, in slot order


def pinned(cls) -> Compiled:
    """The compiled half of a pinned policy `cls` (admits = False): no hooks; its start is the reference's own."""
    def setup(capacity: int, num_layers: int, num_experts: int, **options) -> Setup:
        reference = cls(capacity, num_layers, num_experts, **options)  # its checks, and its pinned set
        keys = sorted(reference.slot_of, key=reference.slot_of.__getitem__)  # slot order = placement order
        return Setup(Pinned(np.array(keys, np.int64)), tuple(keys), admits=False, stream=True)

    return Compiled("pinned", Pinned, setup, stream=_pinned_stream, label="pinned (static_layers, frequency)")


def _pinned_stream(policy, stream, split, c0, c1, log):
    """Offload: pinned_stream.py's loop; any other split: the driver (its split code compiled on first use)."""
    if split.mode != "offload":
        return policy.replay(stream, split, c0, c1, log, generic=True)
    from freetoken.placement.compiled.pinned_stream import replay_offload

    return replay_offload(policy.core, stream.keys, stream.tokens, stream.offsets, c0, c1, log)
