"""Compile (or load from the cache) the compiled placement before anyone waits on it or times it: `ft warmup`,
scripts/setup.sh, ft serve before it says ready, ft generate before its clock starts, a sweep's parent process
before its workers start (each would compile the same code otherwise)."""

from __future__ import annotations

import time
from collections.abc import Iterable

import numpy as np

from freetoken.placement.call import DECODE, PREFILL
from freetoken.placement.callstream import call_stream, layer_calls, make_call
from freetoken.placement.stream import KeyStream

L, E, C = 2, 4, 3  # compiled code is specialised on types, not sizes: a tiny instance compiles what a real one runs


def warm_calls() -> None:
    """The call builder: a trace's CallStream (the simulator), one call of a prefill chunk and a CPU-only decode
    step's calls (the engine)."""
    experts = np.array([[[0, 1], [2, 3]], [[1, 0], [3, 2]]], np.int16)  # [T, L, K]
    call_stream(experts, E, np.zeros(2, np.int32), np.zeros(2, np.int32), np.zeros(2, np.int8), 2)
    make_call(0, np.array([[0, 1], [1, 2]]), PREFILL)
    layer_calls(np.array([[[0, 1]], [[2, 3]]], np.int32), E, DECODE)


def warm_policy(policy) -> None:
    """The code `policy` runs (nothing for an interpreted one), before its first call is timed or waited on."""
    if hasattr(policy, "warm"):
        policy.warm()
        warm_calls()


def default_jobs() -> int:
    """Worker processes for a warm-up: one per core this process may run on, up to 4."""
    from freetoken.defaults import usable_cores

    return min(4, usable_cores())


def warm(names: Iterable[str], log=lambda name, seconds: None, jobs: int = 1) -> dict[str, float]:
    """The call builder and each named policy (a key of POLICIES with a compiled half); returns CPU seconds each
    took (a fraction of a second: loaded from the cache). jobs > 1: the policies' compiled halves are compiled in
    that many worker processes at once, each half in one worker (a family sharing one, as the layer-sweep family
    does, is not compiled twice)."""
    from freetoken.placement import POLICIES, is_compiled

    for name in names:
        if not is_compiled(name):
            raise ValueError(f"policy {name!r} has no compiled half to warm (it runs interpreted)")
    groups = _groups({name: POLICIES[name] for name in names})
    t0 = time.process_time()
    warm_calls()
    spent = {"the call builder": time.process_time() - t0}
    log("the call builder", spent["the call builder"])
    if jobs <= 1 or len(groups) <= 1:
        results = map(_warm_group, groups)
    else:  # spawned workers: fork would copy numba's compiler state mid-use
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        pool = ProcessPoolExecutor(min(jobs, len(groups)), mp_context=multiprocessing.get_context("spawn"))
        with pool:
            results = [f.result() for f in as_completed([pool.submit(_warm_group, g) for g in groups])]
    for got in results:
        for name, seconds in got.items():
            spent[name] = seconds
            log(name, seconds)
    return spent


def _groups(classes: dict) -> list[list[str]]:
    """The names, grouped by the compiled half their classes share; the largest group first (the layer-sweep
    family's, the costliest to compile: a worker starts on it while others take the rest)."""
    groups: dict[str, list[str]] = {}
    for name, cls in classes.items():
        groups.setdefault(cls.compiled.name, []).append(name)
    return sorted(groups.values(), key=len, reverse=True)


def _warm_group(names: list[str]) -> dict[str, float]:
    """Compile (or load) each policy of one group, in this process; CPU seconds each."""
    from freetoken.placement import POLICIES, make_policy

    spent = {}
    for name in names:
        t0 = time.process_time()
        make_policy(name, C, L, E, **_options(POLICIES[name])).warm()
        spent[name] = time.process_time() - t0
    return spent


def _options(cls) -> dict:
    """The sources a policy class needs to be built (a future, a profile), tiny."""
    options = {}
    if cls.needs_future:
        options["future"] = KeyStream(np.array([0, 1, 4, 5], np.int64), np.array([0, 2, 4], np.int64))
    needs_profile = getattr(cls, "needs_profile", None)
    if needs_profile is not None and needs_profile({}):
        options["profile"] = np.ones((L, E), np.int64)
    return options
