"""Compiled placement: built-in policies decide in numba code on one flat array state, equal to their Python
reference (freetoken.placement.<policy>) Plan by Plan. make_policy returns a CompiledPolicy for the names in
COMPILED; a Python PlacementPolicy subclass keeps working everywhere, interpreted.

Layout
    base.py        the core state (slot_of, key_of_slot, free-slot stack, last_use, protection marks, clocks) and
                   the default no-op hooks
    split.py       the miss split (every mode, rule and fetch order) as compiled code
    driver.py      the generic decision: apply_call (one call -> Plan arrays) and replay_calls (a CallStream ->
                   ReplayLog columns), written once against a `hooks` module
    specialise.py  copies driver.py per policy (its hooks import rewritten) so numba inlines and caches each one
    policy.py      CompiledPolicy (the PlacementPolicy the engine and the simulator hold) and COMPILED
    lru.py, pinned.py (static_layers, frequency), belady.py: one module per policy
    lru_stream.py  LRU's own stream replay (scope unified): a Setup may name such a file (Setup.stream, same
                   signature as driver.replay_calls), loaded by specialise.stream_for; CompiledPolicy.replay uses it
                   unless generic=True, and a test must show it equal to the generic driver (tests/test_lru_stream.py)
    heap.py        the indexed binary heap belady (by next use) and the sweeps (by z) keep their residents in
    linked.py      the doubly linked lists over keys of lru (recency) and s3fifo (its three FIFOs)

How to add a compiled policy `foo` (its Python reference freetoken/placement/foo.py already exists):
    1. Write freetoken/placement/compiled/foo.py with
         def setup(name, capacity, num_layers, num_experts, **options) -> Setup
             validate options (one-line ValueError, as the reference), build the policy's arrays as a tuple
             `state` (every hook gets it as `p`), and say admits / orders_admission / prefetches / pinned.
         the hooks it needs, each @numba.njit(cache=True, inline="always") (helpers they call too), and
         `from freetoken.placement.compiled.base import ...` for the rest (the driver imports all ten by name):
             begin_call(p, st, c, keys)        call c's keys [n], before any is applied
             observe_call(p, st, c, keys, tokens, phase)   then the call's routed tokens [n] and phase (counts)
             on_hit(p, key, now) / on_miss(p, key, now) / on_admit(p, key, now) / on_evict(p, key)
             victim(p, st, key, now) -> int    a resident key with not base.is_protected(st, k), or -1 (bypass)
             admission_order(p, keys, n, order)   (orders_admission) fill order[:n]: the fetched keys[:n]'s
                                               order of slot offers
             prefetch_for(p, st, c, keys, out) -> int   (prefetches) write keys to copy ahead into out, most wanted
                                               first; return how many
             on_prefetch(p, key, now)
       The driver runs without numba's reference counting, so hooks must not allocate (numba refuses to compile
       it): keep every array the policy needs in `state`, sized in setup(). The core state `st` is read-only to
       hooks (the driver owns slots, clocks and protection marks).
    2. Add "foo": "freetoken.placement.compiled.foo" to COMPILED in policy.py.
    3. Add foo to the policy list of tests/test_compiled_policies.py: it checks compiled == reference Plan by Plan
       over splits x fetch orders x capacities on real and synthetic traces, and the stream log == per-call plans.
The first use of each policy compiles its driver (seconds; said once on stderr) and caches it on disk
($FT_CACHE_DIR or ~/.cache/freetoken/compiled); any edit to this package gives a fresh compile.
"""

from freetoken.placement.compiled.policy import COMPILED, CompiledPolicy
from freetoken.placement.compiled.setup import Setup

__all__ = ["COMPILED", "CompiledPolicy", "Setup"]
