"""CompiledPolicy: a built-in policy whose plan() runs its compiled half (the class's `compiled`) on its arrays.

It is a PlacementPolicy (the engine and the simulator hold it like any other), built by make_policy for a class with
a compiled half; `replay` runs a whole CallStream through the same state without returning to Python per call.
"""

from __future__ import annotations

import numpy as np

from freetoken.placement.call import Call, Plan
from freetoken.placement.compiled.core import CALLS, CLOCK, new_core, new_scratch
from freetoken.placement.compiled.split import split_array
from freetoken.placement.policy import NOT_RESIDENT, PlacementPolicy, check_size
from freetoken.placement.split import Split


class CompiledPolicy(PlacementPolicy):
    def __init__(self, cls: type[PlacementPolicy], capacity: int, num_layers: int, num_experts: int, **options):
        check_size(capacity, num_layers, num_experts)
        self.form = cls.compiled
        s = self.form.setup(capacity, num_layers, num_experts, **options)
        self.name, self.capacity, self.num_layers, self.num_experts = cls.name, capacity, num_layers, num_experts
        self.admits = s.admits
        self.state, self.core = s.state, new_core(capacity, num_layers, num_experts, s.pinned)
        self.flags = (int(s.admits), int(s.orders_admission), int(s.prefetches))  # driver.ADMITS, ...
        self.own_stream = s.stream  # replay() takes the form's own stream replay
        self._scratch = None  # the driver's, made on its first call (a stream replay of its own needs none)
        self._plan_entry = None  # plan()'s compiled replay, reached without numba's per-call typing (_replay_one)

    @property
    def _buf(self):
        if self._scratch is None:
            self._scratch = new_scratch(self.capacity, self.num_layers, self.num_experts)
        return self._scratch

    def warm(self) -> None:
        """Load (or compile) the compiled code this policy runs, without planning anything: a server or a timed run
        calls it before it says ready or starts its clock."""
        self.form.warm(self)

    # the decision
    def plan(self, call: Call, split: Split) -> Plan:
        E, experts, buf = self.num_experts, call.experts, self._buf
        n = len(experts)
        if not 0 <= call.layer < self.num_layers:
            raise ValueError(f"call layer {call.layer} is out of range [0, {self.num_layers})")
        if n and (min(experts) < 0 or max(experts) >= E):
            raise ValueError(f"call experts {experts} are out of range [0, {E})")
        keys = np.asarray(experts, np.int32)  # a CallStream's dtypes: plan() runs the stream replay's code
        keys += call.layer * E
        buf.offsets[1], buf.phase[0] = n, call.phase
        self._replay_one((self.state, self.core, keys, np.asarray(call.tokens, np.int32), buf.offsets, buf.phase, 0,
                          1, split_array(split), self.flags, buf, buf.log))
        ne, npf = buf.log[3, 0], buf.log[4, 0]
        return Plan.from_kinds(call.layer, experts, buf.kind[:n].tolist(), buf.slot[:n].tolist(),
                               buf.evicted[:ne].tolist(), buf.prefetched[:npf].tolist(), E)

    def _replay_one(self, args: tuple) -> None:
        """The driver's replay of plan()'s one call. Its arguments' types never change for this policy (its own
        arrays, and arrays plan() makes with fixed dtypes), so after the first call, which numba types and dispatches
        (compiling or loading the code), the compiled entry of that signature is called directly: numba's typing of
        a dozen arrays in named tuples took most of a decode call's plan."""
        if self._plan_entry is not None:
            return self._plan_entry(*args)
        replay = self.form.replay
        replay(*args)
        compiled = replay.overloads.get(tuple(replay.typeof_pyval(a) for a in args))
        self._plan_entry = None if compiled is None else compiled.entry_point
        return None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_plan_entry": None}  # (a compiled entry does not pickle: found again on use)

    def replay(self, stream, split: Split, c0: int, c1: int, log: np.ndarray, generic: bool = False):
        """Calls c0..c1-1 of a CallStream in compiled code; fills log [8, C] (see compiled/driver.py). The form's own
        stream replay when this policy takes it, unless generic (the driver's, same results). Returns None, or from
        a stream replay the sums (hits, cpu, evictions, cpu_tokens) over these calls; it then also fills rows 8, 9
        (experts, tokens per call) of a log [10, C]."""
        if self.own_stream and not generic:
            return self.form.stream(self, stream, split, c0, c1, log)
        self.form.replay(self.state, self.core, stream.keys, stream.tokens, stream.offsets, stream.phase, c0, c1,
                         split_array(split), self.flags, self._buf, log)
        return None

    # inspection (the reference's attributes, read from the arrays)
    @property
    def slot_of(self) -> dict[int, int]:
        keys = np.flatnonzero(self.core.slot_of >= 0)
        return dict(zip(keys.tolist(), self.core.slot_of[keys].tolist()))

    def slot(self, layer: int, expert: int) -> int:
        s = int(self.core.slot_of[layer * self.num_experts + expert])
        return s if s >= 0 else NOT_RESIDENT

    @property
    def clock(self) -> int:
        return int(self.core.counters[CLOCK])

    @property
    def calls_planned(self) -> int:
        return int(self.core.counters[CALLS])

    @property
    def last_use(self) -> list[int]:
        return self.core.last_use.tolist()
