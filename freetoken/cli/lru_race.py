"""The LRU speed race of `ft bench sim`: our replay against libCacheSim's C trace path and against the plainest
compiled set-access LRU (plain_lru.py), on the same key stream.

Every side starts from the call stream's keys and ends with a miss count (all three equal, checked). Ours builds
the compiled LRU policy, replays every call through sim.replay.replay_stream (the full per-call log, as `ft sim`
uses it) and reads its total; the plain loop allocates its arrays and counts misses; libCacheSim reads its
oracleGeneral input, written once beforehand (untimed), with its C reader and runs process_trace. The runs are timed
two ways, each side's best run counting: back to back (each side repeated in a row) and interleaved (one run of each
per round, so all see the same machine load and none finds caches and branch predictors trained by its own previous
run of the same stream: on a trace of a few thousand calls that training alone made our loop ~1.6x faster). Two more
rows say where our time goes: the compiled loop alone (policy built and log allocated outside its timer) and the
trace -> call stream conversion timed in (the others have no counterpart: they are handed the keys).
"""

from __future__ import annotations

import time

MIN_SECONDS = 2.0  # each way of timing repeats runs until they took this long (a small trace's run takes ~1 ms)


def best_runs(entries: dict, repeat: int, min_seconds: float, interleave: bool) -> dict:
    """{name: (result, best wall s, best CPU s)}. entries: name -> (prepare, run): before each timed run(prepared)
    an untimed prepare() (None: none). Interleaved: rounds of one run of each entry, until there are `repeat` rounds
    and they took min_seconds. Back to back: each entry's runs in a row, as many and as long (its share of
    min_seconds). Wall and CPU time each take their own best."""
    best = {name: [None, float("inf"), float("inf")] for name in entries}

    def once(name: str) -> float:
        prepare, run = entries[name]
        arg = prepare() if prepare is not None else None
        w0, c0 = time.perf_counter(), time.process_time()
        out = run(arg)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        b = best[name]
        b[0], b[1], b[2] = out, min(b[1], wall), min(b[2], cpu)
        return wall

    groups = [list(entries)] if interleave else [[name] for name in entries]
    for group in groups:
        runs, spent = 0, 0.0
        while runs < repeat or spent < min_seconds / len(groups):
            spent += sum(once(name) for name in group)
            runs += 1
    return {name: tuple(b) for name, b in best.items()}


def speed(misses: int, wall: float, cpu: float, n: int) -> dict:
    return {"misses": misses, "seconds": wall, "cpu_seconds": cpu, "accesses_per_s": n / wall,
            "accesses_per_cpu_s": n / cpu if cpu else float("inf")}


def race(trace, stream, capacity: int, prefill_chunk: int, repeat: int,
         min_seconds: float = MIN_SECONDS) -> dict:
    """{'ours', 'ours_loop', 'ours_from_trace', 'plain', 'libcachesim', 'libcachesim_writing'}: speed() rows back
    to back, and the ratios of the others' time to ours ('ours_vs_libcachesim', 'ours_vs_plain',
    'ours_vs_libcachesim_writing' (its input file written in its time, as `ft bench sim` timed it before), their
    '_cpu' twins, and 'ours_from_trace_vs_libcachesim'); the same keys prefixed 'interleaved_' for the interleaved
    runs."""
    import tempfile
    from pathlib import Path

    import numpy as np

    from freetoken.cli.plain_lru import plain_lru_misses
    from freetoken.placement import Split, make_policy
    from freetoken.sim.calls import trace_stream
    from freetoken.sim.libcachesim import file_misses, libcachesim_misses, ram_dir, write_oracle_general
    from freetoken.sim.replay import replay_stream

    L, E, C, n = trace.num_layers, trace.num_experts, stream.num_calls, stream.num_accesses
    split = Split("offload")

    def loop(prepared) -> int:
        policy, log = prepared
        hits, cpu = policy.replay(stream, split, 0, C, log)[:2]
        return n - hits - cpu

    with tempfile.TemporaryDirectory(prefix="ft-race-", dir=ram_dir()) as tmp:
        path = Path(tmp) / "keys.oracleGeneral.bin"
        write_oracle_general(path, stream.keys, with_next_access=False)
        entries = {
            "ours": (None, lambda _: replay_stream(stream, make_policy("lru", capacity, L, E), split).total.misses),
            "ours_loop": (lambda: (make_policy("lru", capacity, L, E), np.empty((10, C), np.int64)), loop),
            "ours_from_trace": (None, lambda _: replay_stream(trace_stream(trace, prefill_chunk),
                                                              make_policy("lru", capacity, L, E), split).total.misses),
            "plain": (None, lambda _: plain_lru_misses(stream.keys, stream.offsets, L * E, capacity)),
            "libcachesim": (None, lambda _: file_misses(path, n, capacity)),
            "libcachesim_writing": (None, lambda _: libcachesim_misses(stream.keys, capacity)),  # its file too
        }
        for _, run in entries.values():  # loads (or compiles) each side, untimed (libCacheSim: its cache set-up)
            run((make_policy("lru", capacity, L, E), np.empty((10, C), np.int64)))
        out: dict = {}
        for mode, interleave in (("", False), ("interleaved_", True)):
            got = best_runs(entries, repeat, min_seconds, interleave)
            rows = {name: speed(*got[name], n) for name in entries}
            if rows["ours"]["misses"] != rows["plain"]["misses"]:
                raise RuntimeError(f"the plain loop counts {rows['plain']['misses']} misses, ours "
                                   f"{rows['ours']['misses']}")
            out.update({f"{mode}{name}": row for name, row in rows.items()})
            for name, other in (("ours", "libcachesim"), ("ours_from_trace", "libcachesim"), ("ours", "plain"),
                                ("ours", "libcachesim_writing")):
                key = f"{mode}{name}_vs_{other}"
                out[key] = rows[other]["seconds"] / rows[name]["seconds"]
                cpu = rows[name]["cpu_seconds"]
                out[f"{key}_cpu"] = rows[other]["cpu_seconds"] / cpu if cpu else None
    return out
