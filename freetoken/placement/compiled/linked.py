"""Doubly linked lists over keys for the compiled policies: nxt / prv [K + s] int arrays, indices K.. are the lists'
sentinels (nxt[sentinel] = head, prv[sentinel] = tail; an empty list's sentinel points at itself). lru keeps its
recency in one list, s3fifo its three FIFOs in one pair of arrays. lru_stream keeps lru's list in its own loop.

Links are read as uint64: numba then indexes without the negative-index wraparound (~1.3x on lru's replay)."""

from __future__ import annotations

from numba import uint64 as U64

from freetoken.placement.compiled.cache import jit


@jit
def unlink(nxt, prv, key):
    """Take `key` out of its list (its own links are left as they were: the caller's to reset)."""
    a, b = U64(prv[key]), U64(nxt[key])
    nxt[a] = b
    prv[b] = a


@jit
def append(nxt, prv, sentinel, key):
    """Put `key` at the tail of the list whose sentinel is `sentinel`."""
    s = U64(sentinel)
    tail = U64(prv[s])
    nxt[tail] = key
    prv[key] = tail
    nxt[key] = s
    prv[s] = key
