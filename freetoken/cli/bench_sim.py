"""ft bench sim: how fast the simulator replays, against libCacheSim's Python bindings, and what the one-pass
miss-ratio curve saves over replaying capacity by capacity. Both ratios come from one run on one key stream.

libCacheSim is measured on its fastest documented Python path, end to end: the key stream written as an
oracleGeneral binary trace (numpy, one write), read by its C reader and run by `process_trace` in C. Its
per-request path (`cache.get(Request)` from Python) is timed too. Our side is `sim.replay.replay` with the
production LRU policy over the same calls, producing the full per-call log.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from freetoken.cli.common import print_json, progress
from freetoken.paths import DEFAULT_TRACE

ORACLE_GENERAL = np.dtype([("clock_time", "<u4"), ("obj_id", "<u8"), ("obj_size", "<u4"),
                           ("next_access_vtime", "<i8")])  # libCacheSim's oracleGeneral record, 24 bytes


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

    rec = np.zeros(len(keys), ORACLE_GENERAL)
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
    lcs = _libcachesim()
    keys = np.asarray(keys, np.int64)
    if keys.size == 0:
        return 0
    with tempfile.TemporaryDirectory(prefix="ft-lcs-") as tmp:
        path = Path(tmp) / "keys.oracleGeneral.bin"
        write_oracle_general(path, keys, with_next_access=algorithm.startswith("Belady"))
        reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
        miss_ratio, _ = getattr(lcs, algorithm)(capacity, hashpower=_hashpower(capacity)).process_trace(reader)
        del reader
    return int(round(miss_ratio * keys.size))


def _hashpower(capacity: int) -> int:
    """Its hash table sized to the cache (the default, 2**24 buckets, costs more to allocate than small runs take)."""
    return max(4, int(capacity).bit_length() + 1)


def libcachesim_misses_per_request(keys: np.ndarray, capacity: int) -> int:
    """libCacheSim LRU fed one Request at a time from Python: the path for a stream not on disk."""
    lcs = _libcachesim()
    cache, req = lcs.LRU(capacity, hashpower=_hashpower(capacity)), lcs.Request()
    req.obj_size = 1
    hits = 0
    for key in keys.tolist():
        req.obj_id = key
        hits += cache.get(req)
    return len(keys) - hits


def _timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def run_bench(trace, capacities: int = 20, prefill_chunk: int = 2048, fraction: float = 0.25,
              per_request: bool = True, log=lambda s: None) -> dict:
    from freetoken.placement import LRU, Split, key_stream
    from sim.calls import trace_calls
    from sim.mrc import lru_mrc
    from sim.replay import replay

    if capacities < 1:
        raise ValueError(f"--capacities must be >= 1, got {capacities}")
    L, E = trace.num_layers, trace.num_experts
    calls, t_calls = _timed(lambda: list(trace_calls(trace, prefill_chunk)))
    n = sum(len(c.experts) for c in calls)
    if n == 0:
        raise ValueError("the trace has no expert accesses")
    largest = max(len(c.experts) for c in calls)
    capacity = max(largest, int(round(fraction * trace.num_keys)))
    split = Split("offload")

    # replay speed: ours vs libcachesim on the same key stream
    log(f"replaying {n} accesses through lru at capacity {capacity}")
    ours, t_ours = _timed(lambda: replay(calls, LRU(capacity, L, E), split).total.misses)
    keys = key_stream(calls, E).keys

    def lcs_end_to_end():
        return libcachesim_misses(key_stream(calls, E).keys, capacity)  # includes building its input

    lcs_misses, t_lcs = _timed(lcs_end_to_end)
    out = {"trace": trace.source, "model": trace.model, "accesses": n, "calls": len(calls), "top_k": trace.top_k,
           "capacity": capacity, "build_calls_s": t_calls,
           "ours": {"misses": ours, "seconds": t_ours, "accesses_per_s": n / t_ours},
           "libcachesim": {"misses": lcs_misses, "seconds": t_lcs, "accesses_per_s": n / t_lcs}}
    if per_request:
        log("libcachesim, one request at a time from Python")
        m, t = _timed(libcachesim_misses_per_request, keys, capacity)
        out["libcachesim_per_request"] = {"misses": m, "seconds": t, "accesses_per_s": n / t}

    # one pass vs replays
    log("one-pass miss-ratio curve")
    curve, t_mrc = _timed(lambda: lru_mrc(key_stream(calls, E)))
    hi = min(trace.num_keys, len(curve.capacities) - 1)
    grid = np.unique(np.linspace(curve.min_exact_capacity, max(hi, curve.min_exact_capacity), capacities)
                     .round().astype(int)).tolist()
    t_replays, agree = 0.0, True
    with progress(len(grid), f"replaying {len(grid)} capacities", enabled=True) as advance:
        for cap in grid:
            misses, t = _timed(lambda: replay(calls, LRU(cap, L, E), split).total.misses)
            t_replays += t
            agree &= misses == curve.misses_at(cap)
            advance()
    out["mrc"] = {"seconds": t_mrc, "capacities": len(grid), "replays_seconds": t_replays,
                  "speedup": t_replays / t_mrc, "agrees_with_replays": bool(agree),
                  "min_exact_capacity": curve.min_exact_capacity}
    out["replay_vs_libcachesim"] = t_lcs / t_ours  # > 1: ours is faster
    if per_request:
        out["replay_vs_libcachesim_per_request"] = out["libcachesim_per_request"]["seconds"] / t_ours
    return out


def register(sub) -> None:
    p = sub.add_parser("sim", help="replay speed vs libCacheSim, and the one-pass miss-ratio curve vs replays")
    p.add_argument("--trace", default=str(DEFAULT_TRACE),
                   help="a .safetensors trace, or any log `ft trace import` reads (format detected from content)")
    p.add_argument("--capacities", type=int, default=20, help="capacities replayed against the one-pass curve")
    p.add_argument("--prefill-chunk", type=int, default=2048, help="tokens per prefill call")
    p.add_argument("--fraction", type=float, default=0.25, help="cache size for the speed race, of all experts")
    p.add_argument("--no-per-request", action="store_true", help="skip libCacheSim's slow per-request path")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def load_any(path: str):
    from freetoken.trace import load

    if str(path).endswith(".safetensors"):
        return load(path)
    from freetoken.trace.importers import import_trace

    return import_trace(path)


def run(args: argparse.Namespace) -> int:
    if args.prefill_chunk <= 0:
        raise ValueError(f"--prefill-chunk must be positive, got {args.prefill_chunk}")
    if not 0 < args.fraction <= 1:
        raise ValueError(f"--fraction must lie in (0, 1], got {args.fraction}")
    if not Path(args.trace).is_file():
        raise ValueError(f"--trace {args.trace}: no such file")
    trace = load_any(args.trace)
    log = None if args.json else (lambda s: print(f"  {s}", flush=True))
    out = run_bench(trace, args.capacities, args.prefill_chunk, args.fraction, not args.no_per_request,
                    log or (lambda s: None))
    out["trace"] = args.trace
    if args.json:
        print_json(out)
        return 0
    o, c = out["ours"], out["libcachesim"]
    print(f"{args.trace}: {out['accesses']} accesses in {out['calls']} calls (top-{out['top_k']}), "
          f"LRU capacity {out['capacity']}")
    print(f"  ours (sim.replay, lru)          {o['seconds']:8.3f} s  {o['accesses_per_s'] / 1e6:6.2f} M accesses/s"
          f"  misses {o['misses']}")
    print(f"  libcachesim (C reader, e2e)     {c['seconds']:8.3f} s  {c['accesses_per_s'] / 1e6:6.2f} M accesses/s"
          f"  misses {c['misses']}" + ("" if out["top_k"] == 1 else "  (sequential model: differs for top-k)"))
    if "libcachesim_per_request" in out:
        r = out["libcachesim_per_request"]
        print(f"  libcachesim (Request per key)   {r['seconds']:8.3f} s  {r['accesses_per_s'] / 1e6:6.2f} M accesses/s")
    m = out["mrc"]
    print(f"  one-pass MRC {m['seconds']:.3f} s vs {m['capacities']} replays {m['replays_seconds']:.3f} s; "
          f"equal at every capacity: {m['agrees_with_replays']}")
    print(f"ratio replay speed ours / libcachesim e2e: {out['replay_vs_libcachesim']:.2f}x"
          + (f"   ours / libcachesim per request: {out['replay_vs_libcachesim_per_request']:.2f}x"
             if "replay_vs_libcachesim_per_request" in out else ""))
    print(f"ratio {m['capacities']}-replay time / one-pass MRC time: {m['speedup']:.1f}x")
    return 0
