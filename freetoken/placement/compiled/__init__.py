"""The engine room of the compiled placement: what every policy's compiled half (freetoken/placement/policies/) runs on.

    core.py     the Core (residency and clocks, the driver's) and the driver's Scratch
    hooks.py    the hooks a policy writes and how the driver reaches them (numba overloads, by State type)
    form.py     Compiled (a policy's State, setup() and hooks) and Setup (what setup() returns)
    driver.py   the decision written once: a run of calls through one policy's hooks; plan() runs one call
    policy.py   CompiledPolicy: the PlacementPolicy the engine and the simulator hold
    split.py    the miss split in compiled code
    heap.py, linked.py, order.py   an indexed heap, doubly linked lists, a stable sort (no allocation)
    lru_stream.py   LRU's own replay of a whole stream (scope unified), equal to the driver's
    pinned_stream.py   static_layers' and frequency's own replay of a stream under offload, equal to the driver's
    cache.py    `jit` and numba's disk cache: per policy, stamped with its file and this folder

docs/policies.md walks through adding a policy.
"""
