"""libCacheSim (its Python bindings, the [dev] extra) as an oracle and a speed reference on our key streams: the
keys written as an oracleGeneral binary trace (its fastest documented path: its C reader, process_trace), or fed one
Request at a time from Python."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

ORACLE_GENERAL = [("clock_time", "<u4"), ("obj_id", "<u8"), ("obj_size", "<u4"),
                  ("next_access_vtime", "<i8")]  # numpy dtype fields of libCacheSim's oracleGeneral record, 24 bytes


def _libcachesim():
    try:
        import libcachesim
    except ImportError:
        raise ValueError("libcachesim is not installed (pip install libcachesim==0.3.5, or the project's [dev] "
                         "extra)") from None
    return libcachesim


def write_oracle_general(path: str | os.PathLike, keys: np.ndarray, with_next_access: bool) -> None:
    """One request per key, size 1 (so cache_size counts objects). next_access_vtime: the index of the
    key's next request, -1 for none (Belady needs it; LRU ignores it)."""
    from freetoken.placement.stream import NEVER, next_occurrence

    rec = np.zeros(len(keys), np.dtype(ORACLE_GENERAL))
    rec["clock_time"] = np.arange(1, len(keys) + 1)
    rec["obj_id"] = keys
    rec["obj_size"] = 1
    if with_next_access:
        nxt = next_occurrence(keys)
        rec["next_access_vtime"] = np.where(nxt == NEVER, -1, nxt)
    else:
        rec["next_access_vtime"] = -1
    rec.tofile(path)


def libcachesim_misses(keys: np.ndarray, capacity: int, algorithm: str = "LRU") -> int:
    """Misses of libCacheSim's `algorithm` (LRU, Belady, ...) with `capacity` objects on a sequential key stream."""
    keys = np.asarray(keys, np.int64)
    if keys.size == 0:
        return 0
    with tempfile.TemporaryDirectory(prefix="ft-lcs-", dir=ram_dir()) as tmp:
        path = Path(tmp) / "keys.oracleGeneral.bin"
        write_oracle_general(path, keys, with_next_access=algorithm.startswith("Belady"))
        return file_misses(path, keys.size, capacity, algorithm)


def file_misses(path: str | os.PathLike, accesses: int, capacity: int, algorithm: str = "LRU") -> int:
    """Misses of libCacheSim's `algorithm` over an oracleGeneral file of `accesses` requests (written beforehand:
    this is its C reader and simulator alone)."""
    lcs = _libcachesim()
    reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    miss_ratio, _ = getattr(lcs, algorithm)(capacity, hashpower=hashpower(capacity)).process_trace(reader)
    del reader
    return int(round(miss_ratio * accesses))


def ram_dir() -> str | None:
    """/dev/shm where it is a writable directory (its input file then costs no disk I/O: the fair race), else the
    default temporary directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def hashpower(capacity: int) -> int:
    """Its hash table sized to the cache (the default, 2**24 buckets, costs more to allocate than small runs take)."""
    return max(4, int(capacity).bit_length() + 1)


def libcachesim_misses_per_request(keys: np.ndarray, capacity: int) -> int:
    """libCacheSim LRU fed one Request at a time from Python: the path for a stream not on disk."""
    lcs = _libcachesim()
    cache, req = lcs.LRU(capacity, hashpower=hashpower(capacity)), lcs.Request()
    req.obj_size = 1
    hits = 0
    for key in keys.tolist():
        req.obj_id = key
        hits += cache.get(req)
    return len(keys) - hits
