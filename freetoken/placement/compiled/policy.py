"""CompiledPolicy: a built-in policy whose plan() runs the compiled decision on its array state.

It is a PlacementPolicy (the engine and the simulator hold it like any other), built by make_policy for the names
in COMPILED; `replay` runs a whole CallStream through the same state without returning to Python per call.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

from freetoken.modules import MODULES
from freetoken.placement.call import Call, Plan
from freetoken.placement.compiled.base import CALLS, CLOCK, new_core
from freetoken.placement.compiled.specialise import cache_dir, driver_for, stream_for
from freetoken.placement.compiled.split import split_array
from freetoken.placement.policy import NOT_RESIDENT, PlacementPolicy, check_size
from freetoken.placement.split import Split

COMPILED: dict[str, str] = {  # policy name -> module of its hooks and setup()
    "lru": "freetoken.placement.compiled.lru",
    "static_layers": "freetoken.placement.compiled.pinned",
    "frequency": "freetoken.placement.compiled.pinned",
    "belady": "freetoken.placement.compiled.belady",
    "s3fifo": "freetoken.placement.compiled.s3fifo",
    "layer_sweep": "freetoken.placement.compiled.sweep",
    "lookahead": "freetoken.placement.compiled.sweep",
    "hinted_sweep": "freetoken.placement.compiled.sweep",
    "ktransformers_dynamic": "freetoken.placement.compiled.ktransformers_dynamic",
    "moe_infinity": "freetoken.placement.compiled.moe_infinity",
}
_REPORTED: set[str] = set()


def _timed_first(module: str, fn, *args):
    """Run fn; the first time in this process that it had to compile (no usable disk cache), say so once."""
    if module in _REPORTED:
        return fn(*args)
    t0 = time.perf_counter()
    out = fn(*args)
    _REPORTED.add(module)
    if fn.stats.cache_misses:
        print(f"note: compiled placement driver {module.rsplit('.', 1)[-1]} in {time.perf_counter() - t0:.1f} s "
              f"(once; cached in {cache_dir()})", file=sys.stderr, flush=True)
    return out


def scratch(num_experts: int, capacity: int, num_keys: int) -> tuple:
    """The driver's buffers (it allocates nothing): kind, slot, miss, rank, order, fetched [E] (a call holds at most
    one layer's experts); ev [E + C] (a call's fetches and prefetches evict at most that many); pf, want [K + 1],
    sized 2K + 2: lru_stream's recency queue and each key's position in it. They hold nothing from one compiled
    call to the next, so the policies of one size share one set per thread: the thread running the call
    (shared_scratch, CompiledPolicy._scratch)."""
    E, K, e = num_experts, num_keys, np.empty  # (written out: a generator costs ~1 us)
    return (e(E, np.int64), e(E, np.int64), e(E, np.int64), e(E, np.int64), e(E, np.int64), e(E, np.int64),
            e(E + capacity + 1, np.int64), e(2 * K + 2, np.int64), e(2 * K + 2, np.int64))


_SCRATCH = threading.local()  # .by_size: (E, C, K) -> scratch, this thread's
_thread = threading.get_ident


def shared_scratch(num_experts: int, capacity: int, num_keys: int) -> tuple:
    """This thread's scratch for this size (a fresh policy then allocates none of its ~1.4 us)."""
    by_size = getattr(_SCRATCH, "by_size", None)
    if by_size is None or len(by_size) >= 64:  # (a sweep over many sizes starts a new set; policies keep theirs)
        by_size = _SCRATCH.by_size = {}
    size = (num_experts, capacity, num_keys)
    buf = by_size.get(size)
    if buf is None:
        buf = by_size[size] = scratch(*size)
    return buf


class _Fresh:
    """A policy's cold state as setup() and new_core() build it, kept per (name, size) for a policy built without
    options: a new one copies the arrays (~2 us) instead of building them again (~5 us: setup's checks, fills and
    records). flags are only read by the compiled code, so every copy shares them."""

    __slots__ = ("setup", "core", "flags", "flat")

    def __init__(self, s, core: tuple):
        self.setup, self.core = s, core
        self.flags = np.array([s.admits, s.orders_admission, s.prefetches], np.int64)
        self.flat = all(type(a) is np.ndarray for a in s.state)  # else each policy runs setup() itself

    def copy(self, hooks, size: tuple) -> tuple:
        """(state, core) of a new policy: copies of the kept arrays."""
        return _copies(self.setup.state) if self.flat else hooks.setup(*size).state, _copies(self.core)


_FRESH: dict[tuple, _Fresh] = {}


def _copies(arrays: tuple) -> tuple:
    return tuple([a.copy() for a in arrays])


class CompiledPolicy(PlacementPolicy):
    def __init__(self, name: str, capacity: int, num_layers: int, num_experts: int, **options):
        check_size(capacity, num_layers, num_experts)
        module = COMPILED[name]
        hooks = MODULES[module]
        self.name, self.capacity, self.num_layers, self.num_experts = name, capacity, num_layers, num_experts
        size = (name, capacity, num_layers, num_experts)  # setup()'s positional arguments
        fresh = _FRESH.get(size) if not options else None
        if fresh is not None:
            state, core = fresh.copy(hooks, size)
        else:
            s = hooks.setup(*size, **options)
            fresh = _Fresh(s, new_core(capacity, num_layers, num_experts, s.pinned))
            state, core = s.state, fresh.core  # this policy's own, unless kept below
            if not options and len(_FRESH) < 64:
                _FRESH[size] = fresh
                state, core = fresh.copy(hooks, size)
        s = fresh.setup
        self.admits = s.admits
        self.state, self.core, self.flags = state, core, fresh.flags
        self._module = module
        self._driver = driver_for(module)
        self._stream = (s.stream.removesuffix(".py"), stream_for(s.stream)) if s.stream else (module, self._driver)
        self._buf, self._owner = shared_scratch(num_experts, capacity, num_layers * num_experts), _thread()

    def _scratch(self) -> tuple:
        """The scratch of a call run by a thread other than the building one (whose set self._buf keeps at hand:
        `self._buf if _thread() == self._owner else self._scratch()`, one comparison): that thread's own. So two
        threads never write one set at once: a set is only used under the ident of the thread it was taken in,
        and live threads' idents differ (a thread given a dead one's ident takes over its sets, alone again)."""
        return shared_scratch(self.num_experts, self.capacity, self.num_layers * self.num_experts)

    # the decision
    def plan(self, call: Call, split: Split) -> Plan:
        E = self.num_experts
        experts = call.experts
        n = len(experts)
        if not 0 <= call.layer < self.num_layers:
            raise ValueError(f"call layer {call.layer} is out of range [0, {self.num_layers})")
        ids = np.asarray(experts, np.int64)
        if n and (ids.min() < 0 or ids.max() >= E):
            raise ValueError(f"call experts {experts} are out of range [0, {E})")
        keys = ids + call.layer * E
        tokens = np.asarray(call.tokens, np.int64)
        buf = self._buf if _thread() == self._owner else self._scratch()  # the running thread's
        kind, slot, ev, pf = buf[0], buf[1], buf[6], buf[7]
        ne, npf = _timed_first(self._module, self._driver.apply_call, self.state, self.core, keys, tokens,
                               call.phase, split_array(split), self.flags, buf)
        return Plan.from_kinds(call.layer, experts, kind[:n].tolist(), slot[:n].tolist(), ev[:ne].tolist(),
                               pf[:npf].tolist(), E)

    def replay(self, stream, split: Split, c0: int, c1: int, log: np.ndarray, generic: bool = False):
        """Calls c0..c1-1 of a CallStream in compiled code; fills log [8, C] (see driver.replay_calls). The
        policy's own stream replay when its Setup names one, unless generic (the driver's, same results). Returns
        None, or from a stream replay the sums (hits, cpu, evictions, cpu_tokens) over these calls; it then also
        fills rows 8, 9 (experts, tokens per call) of a log [10, C]."""
        name, code = (self._module, self._driver) if generic else self._stream
        args = (self.state, self.core, stream.keys, stream.tokens, stream.offsets, stream.phase, c0, c1,
                split_array(split), self.flags, self._buf if _thread() == self._owner else self._scratch(), log)
        if name in _REPORTED:  # (loaded: no timer around it)
            return code.replay_calls(*args)
        return _timed_first(name, code.replay_calls, *args)

    # inspection (the reference's attributes, read from the arrays)
    @property
    def slot_of(self) -> dict[int, int]:
        slot_of = self.core[0]
        keys = np.flatnonzero(slot_of >= 0)
        return dict(zip(keys.tolist(), slot_of[keys].tolist()))

    def slot(self, layer: int, expert: int) -> int:
        s = int(self.core[0][layer * self.num_experts + expert])
        return s if s >= 0 else NOT_RESIDENT

    @property
    def clock(self) -> int:
        return int(self.core[5][CLOCK])

    @property
    def calls_planned(self) -> int:
        return int(self.core[5][CALLS])

    @property
    def last_use(self) -> list[int]:
        return self.core[3].tolist()
