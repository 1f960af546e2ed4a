"""A pinned policy (static_layers, frequency: residency fixed at its start) replaying a CallStream under the offload
split in one loop: a resident key is a hit, any other is fetched into staging (nothing is admitted, so nothing is
evicted or prefetched). The same log, sums and Core state (marks, clocks, call count) as the driver's, which runs
the other splits (form.py's pinned stream falls back to it) and plan(); tests/test_pinned_stream.py checks both
equal. An offload run compiles this loop alone, not the driver with the split's code.
"""

from numba import int64 as I64
from numba import uint64 as U64

from freetoken.placement.compiled.cache import jit
from freetoken.placement.compiled.core import CALLS, CLOCK, STAMP
from freetoken.placement.compiled.notes import label


@jit(entry=True)
def replay_offload(st, keys, tokens, offsets, c0, c1, log):
    """Calls c0..c1-1 (offload) over Core st; fills log[:8, c0:c1] as the driver does, rows 8 and 9 (experts and
    (token, expert) pairs per call) too when log has 10 rows. Returns the sums of hits, cpu, evictions and cpu
    tokens (cpu and evictions 0: every miss is fetched, none admitted)."""
    slot_of, mark, last_use, ints = st.slot_of, st.mark, st.last_use, st.counters
    now, stamp = ints[CLOCK], ints[STAMP]
    rows = log.shape[0]
    total = 0
    for c in range(c0, c1):
        lo, hi = offsets[U64(c)], offsets[U64(c + 1)]
        stamp += 1
        h = ht = tt = 0
        for i in range(lo, hi):
            key = U64(keys[U64(i)])
            t = I64(tokens[U64(i)])
            tt += t
            if slot_of[key] >= 0:
                h += 1
                ht += t
            mark[key] = stamp
            last_use[key] = now
            now += 1
        cu = U64(c)
        log[0, cu], log[1, cu], log[2, cu], log[3, cu] = h, hi - lo - h, 0, 0
        log[4, cu], log[5, cu], log[6, cu], log[7, cu] = 0, ht, tt - ht, 0
        if rows > 8:
            log[8, cu], log[9, cu] = hi - lo, tt
        total += h
    ints[CLOCK], ints[STAMP] = now, stamp
    ints[CALLS] += c1 - c0
    return total, 0, 0, 0


label(replay_offload, "pinned's stream replay (offload)")
