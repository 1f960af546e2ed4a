"""ft bench sim: how fast the simulator replays, against libCacheSim's Python bindings, and what the one-pass
miss-ratio curve saves over replaying capacity by capacity. Both ratios come from one run on one key stream.

libCacheSim is measured on its fastest documented Python path: the key stream written beforehand as an
oracleGeneral binary trace, read by its C reader and run by `process_trace` in C (the timed part). Its per-request
path (`cache.get(Request)` from Python) is timed too. Our side is `sim.replay.replay_stream` with the production
(compiled) LRU policy over the same calls, building the policy and producing the full per-call log; it is timed from
the call stream (as libCacheSim from the keys) and, separately, from the trace (conversion included). The plainest
compiled set-access LRU (plain_lru.py) runs beside both, the physical anchor ours must not lose to
(freetoken.cli.lru_race). --race adds that race alone on more traces.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from freetoken.cli.common import print_json
from freetoken.progress import progress
from freetoken.cli.lru_race import MIN_SECONDS, best_runs, race, speed
from freetoken.paths import DEFAULT_TRACE
from freetoken.defaults import DEFAULT_PREFILL_CHUNK, check_prefill_chunk

def _timed(fn, repeat: int = 1):
    """(result, wall seconds, CPU seconds): the best of `repeat` runs (one run of a few ms is noise on a shared
    machine). Wall and CPU time each take their own best."""
    return best_runs({"run": (None, lambda _: fn())}, repeat, 0.0, False)["run"]


CLASSIC = ("lru", "static_layers", "frequency", "belady", "layer_sweep", "s3fifo")  # the end-to-end target set


def run_bench(trace, capacities: int = 20, prefill_chunk: int = DEFAULT_PREFILL_CHUNK, fraction: float = 0.25,
              per_request: bool = True, repeat: int = 3, policies: list[str] | None = None,
              log=lambda s: None, min_seconds: float = MIN_SECONDS) -> dict:
    import numpy as np

    from freetoken.placement import POLICIES, Split, is_compiled, make_policy
    from freetoken.sim.calls import trace_stream
    from freetoken.sim.mrc import lru_mrc
    from freetoken.sim.replay import replay_stream

    if capacities < 1:
        raise ValueError(f"--capacities must be >= 1, got {capacities}")
    if repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {repeat}")
    if min_seconds < 0:
        raise ValueError(f"--min-seconds must be >= 0, got {min_seconds}")
    unknown = sorted(set(policies or ()) - set(POLICIES))
    if unknown:
        raise ValueError(f"--policies: unknown {', '.join(unknown)}; valid: {', '.join(sorted(POLICIES))}")
    L, E = trace.num_layers, trace.num_experts
    stream, t_calls, _ = _timed(lambda: trace_stream(trace, prefill_chunk), repeat)  # the input both sides take
    n = stream.num_accesses
    if n == 0:
        raise ValueError("the trace has no expert accesses")
    capacity = race_capacity(trace, stream, fraction)
    split = Split("offload")
    out = {"trace": trace.source, "model": trace.model, "accesses": n, "calls": stream.num_calls,
           "top_k": trace.top_k, "capacity": capacity, "build_calls_s": t_calls, "repeat": repeat}

    def lru_misses(cap: int) -> int:
        return replay_stream(stream, make_policy("lru", cap, L, E), split).total.misses

    # replay speed on the same key stream (freetoken.cli.lru_race): ours and libCacheSim alternate, best rounds
    log(f"racing compiled lru against libcachesim on {n} accesses at capacity {capacity} (runs interleaved)")
    out.update(race(trace, stream, capacity, prefill_chunk, repeat, min_seconds))
    if per_request:
        from freetoken.sim.libcachesim import libcachesim_misses_per_request

        log("libcachesim: one Request at a time from Python")
        out["libcachesim_per_request"] = speed(*_timed(
            lambda: libcachesim_misses_per_request(stream.keys, capacity), repeat), n)

    # every policy, end to end as `ft sim` runs it (calls built, options derived, replayed), and its replay alone:
    # the policy built as simulate builds it, then replay_stream timed over the call stream built above
    from freetoken.placement import build_policy
    from freetoken.sim.run import SimConfig, future_stream, simulate

    def replay_alone(config: SimConfig):
        """(result, wall, CPU): the best of `repeat` replays, each of a freshly built policy (built untimed)."""
        def fresh():
            return build_policy(config, L, E, profile=trace, future=future_stream(config, trace, stream))

        timed = (fresh, lambda policy: replay_stream(stream, policy, config.split))
        return best_runs({"replay": timed}, repeat, 0.0, False)["replay"]

    out["policies"] = {}
    head = trace.select(np.arange(trace.num_tokens) < min(trace.num_tokens, 64))  # loads compiled code, untimed
    for name in policies if policies is not None else sorted(POLICIES):
        if is_compiled(name):
            simulate(head, SimConfig(name, split, fraction=fraction, prefill_chunk=prefill_chunk))
        log(f"policy {name}: end to end at capacity {capacity}")
        config = SimConfig(name, split, capacity=capacity, prefill_chunk=prefill_chunk)
        result, wall, cpu = _timed(lambda: simulate(trace, config))
        alone, r_wall, r_cpu = replay_alone(config)
        if alone.total.misses != result.total.misses:
            raise RuntimeError(f"policy {name}: the replay alone counts {alone.total.misses} misses, end to end "
                               f"{result.total.misses}")
        out["policies"][name] = {**speed(result.total.misses, wall, cpu, n), "compiled": is_compiled(name),
                                 "replay": speed(alone.total.misses, r_wall, r_cpu, n)}
    done = [out["policies"][p] for p in CLASSIC if p in out["policies"]]
    if len(done) == len(CLASSIC):
        out["classic_seconds"] = sum(r["seconds"] for r in done)
        out["classic_cpu_seconds"] = sum(r["cpu_seconds"] for r in done)

    # one pass vs replays
    log("one-pass miss-ratio curve")
    from freetoken.placement import KeyStream

    lru_mrc(KeyStream(np.zeros(1, np.int64), np.array([0, 1], np.int64)))  # loads its compiled code, untimed
    curve, t_mrc, c_mrc = _timed(lambda: lru_mrc(stream.key_stream()), repeat)
    hi = max(min(trace.num_keys, len(curve.capacities) - 1), curve.min_exact_capacity)
    grid = np.unique(np.linspace(curve.min_exact_capacity, hi, capacities).round().astype(int)).tolist()
    wall = cpu = 0.0
    agree = True
    with progress(len(grid), f"replaying {len(grid)} capacities") as advance:
        for cap in grid:
            misses, w, c = _timed(lambda: lru_misses(cap))
            wall, cpu = wall + w, cpu + c
            agree &= misses == curve.misses_at(cap)
            advance()
    out["mrc"] = {"seconds": t_mrc, "cpu_seconds": c_mrc, "capacities": len(grid), "replays_seconds": wall,
                  "replays_cpu_seconds": cpu, "speedup": wall / t_mrc, "cpu_speedup": cpu / c_mrc if c_mrc else None,
                  "agrees_with_replays": bool(agree), "min_exact_capacity": curve.min_exact_capacity}
    if "libcachesim_per_request" in out:  # > 1: ours is faster
        out["ours_vs_libcachesim_per_request"] = out["libcachesim_per_request"]["seconds"] / out["ours"]["seconds"]
        out["ours_vs_libcachesim_per_request_cpu"] = (out["libcachesim_per_request"]["cpu_seconds"]
                                                      / out["ours"]["cpu_seconds"])
    return out


def register(sub) -> None:
    p = sub.add_parser("sim", help="replay speed vs libCacheSim, and the one-pass miss-ratio curve vs replays")
    p.add_argument("--trace", default=str(DEFAULT_TRACE),
                   help="a .safetensors trace, or any log `ft trace import` reads (format detected from content)")
    p.add_argument("--capacities", type=int, default=20, help="capacities replayed against the one-pass curve")
    p.add_argument("--prefill-chunk", type=int, default=DEFAULT_PREFILL_CHUNK, help="tokens per prefill call")
    p.add_argument("--fraction", type=float, default=0.25, help="cache size for the speed race, of all experts")
    p.add_argument("--no-per-request", action="store_true", help="skip libCacheSim's per-request path")
    p.add_argument("--repeat", type=int, default=3, help="runs of each speed measurement (the best counts)")
    p.add_argument("--policies", help="comma-separated policies to time end to end (default: all)")
    p.add_argument("--rss", action="store_true",
                   help="also measure peak RSS: `ft sim` (lru) vs a process that only runs libCacheSim on the keys")
    p.add_argument("--min-seconds", type=float, default=MIN_SECONDS,
                   help="the LRU race: each way of timing (back to back, interleaved) repeats runs this long")
    p.add_argument("--race", nargs="+", metavar="TRACE", default=[],
                   help="more traces: on each, the LRU race alone (ours vs libcachesim, same capacity rule)")
    p.add_argument("--race-all", action="store_true",
                   help="the LRU race also on every shipped trace (traces/) and every real routing log under "
                        "$FT_SHARED_TRACES (else ../shared/traces beside the checkout), each read as `ft trace "
                        "import` reads it")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def race_capacity(trace, stream, fraction: float) -> int:
    """The race's LRU size: `fraction` of all experts, at least the largest call."""
    return max(int(stream.sizes().max()), int(round(fraction * trace.num_keys)))


def race_on(trace, prefill_chunk: int, fraction: float, repeat: int, min_seconds: float) -> dict:
    """lru_race.race on one more trace, with its size: {'accesses', 'calls', 'capacity', ...race's rows}."""
    from freetoken.sim.calls import trace_stream

    stream = trace_stream(trace, prefill_chunk)
    if stream.num_accesses == 0:
        raise ValueError(f"{trace.source}: the trace has no expert accesses")
    capacity = race_capacity(trace, stream, fraction)
    return {"accesses": stream.num_accesses, "calls": stream.num_calls, "capacity": capacity,
            **race(trace, stream, capacity, prefill_chunk, repeat, min_seconds)}


def every_trace() -> list[Path]:
    """The shipped traces, then the real routing logs of the shared traces folder (none when it is absent)."""
    from freetoken.paths import SHIPPED_TRACES, shared_traces_dir
    from freetoken.trace.importers import routing_logs

    return [*sorted(SHIPPED_TRACES.glob("*.safetensors")), *routing_logs(shared_traces_dir())]


def run(args: argparse.Namespace) -> int:
    from freetoken.trace.format import trace_file
    from freetoken.trace.importers import read_any

    check_prefill_chunk(args.prefill_chunk, "--prefill-chunk")
    if not 0 < args.fraction <= 1:
        raise ValueError(f"--fraction must lie in (0, 1], got {args.fraction}")
    if args.race_all:
        args.race = [*args.race, *(str(p) for p in every_trace() if str(p) not in (args.trace, *args.race))]
    for flag, path in [("--trace", args.trace)] + [("--race", path) for path in args.race]:
        trace_file(path, flag)
    trace = read_any(args.trace)
    log = (lambda s: None) if args.json else (lambda s: print(f"  {s}", flush=True))
    policies = [p.strip() for p in args.policies.split(",") if p.strip()] if args.policies else None
    out = run_bench(trace, args.capacities, args.prefill_chunk, args.fraction, not args.no_per_request,
                    args.repeat, policies, log, args.min_seconds)
    if args.rss:
        from freetoken.cli.peak_rss import peak_rss

        log("peak RSS: ft sim vs libCacheSim alone, each in a fresh process")
        out["rss"] = peak_rss(trace, args.trace, out["capacity"], args.prefill_chunk)
    out["trace"] = args.trace
    out["races"] = {}
    for path in args.race:
        log(f"race on {path}")
        out["races"][path] = race_on(read_any(path), args.prefill_chunk, args.fraction, args.repeat,
                                       args.min_seconds)
    if args.json:
        print_json(out)
        return 0
    print(f"{args.trace}: {out['accesses']} accesses in {out['calls']} calls (top-{out['top_k']}), "
          f"LRU capacity {out['capacity']}; wall (CPU) ms, best of >= {out['repeat']} runs; the call stream is "
          f"built in {out['build_calls_s'] * 1e3:.1f} ms")
    rows = [("ours: LRU replay of the call stream", "ours"), ("  of which the compiled loop", "ours_loop"),
            ("ours: trace -> call stream + replay", "ours_from_trace"), ("a plain compiled set-LRU loop", "plain"),
            ("libcachesim: its C reader + simulator", "libcachesim"),
            ("libcachesim: file written + C reader", "libcachesim_writing")]
    for mode, title in (("", "runs back to back"), ("interleaved_", "runs interleaved")):
        print(f"  {title}:")
        for label, key in rows:
            _print_row(label, out[f"{mode}{key}"])
    if "libcachesim_per_request" in out:
        _print_row("libcachesim: Request per key", out["libcachesim_per_request"])
    if out["top_k"] > 1:
        print("  (top-k: libcachesim is a sequential cache, ours the set-access model; misses differ, see docs/sim.md)")
    for name, r in out["policies"].items():
        print(f"  policy {name:14s} {'compiled' if r['compiled'] else 'interpreted':11s} {r['seconds']:8.3f} s "
              f"({r['cpu_seconds']:.3f})  {r['accesses_per_s'] / 1e6:7.2f} M accesses/s end to end, "
              f"{r['replay']['accesses_per_s'] / 1e6:7.2f} replay alone  misses {r['misses']}")
    if "classic_seconds" in out:
        print(f"  six classic policies ({', '.join(CLASSIC)}) end to end: {out['classic_seconds']:.2f} s "
              f"({out['classic_cpu_seconds']:.2f} CPU s)")
    m = out["mrc"]
    print(f"  one-pass MRC {m['seconds']:.3f} s ({m['cpu_seconds']:.3f}) vs {m['capacities']} replays "
          f"{m['replays_seconds']:.3f} s ({m['replays_cpu_seconds']:.3f}); equal at every capacity: "
          f"{m['agrees_with_replays']}")
    _print_ratios(args.trace, out)
    if "ours_vs_libcachesim_per_request" in out:
        print(f"ratio replay speed ours / libcachesim_per_request: {out['ours_vs_libcachesim_per_request']:.2f}x "
              f"wall, {out['ours_vs_libcachesim_per_request_cpu']:.2f}x CPU (both given the call stream's keys)")
    print(f"ratio replay speed ours / libcachesim with our trace -> call stream conversion timed in: "
          f"{out['ours_from_trace_vs_libcachesim']:.2f}x wall, {out['ours_from_trace_vs_libcachesim_cpu']:.2f}x CPU")
    for path, r in out["races"].items():
        _print_ratios(path, r)
    if out["races"]:
        _print_race_table(args.trace, out)
    print(f"ratio {m['capacities']} replays / one-pass MRC: {m['speedup']:.1f}x wall, {m['cpu_speedup']:.1f}x CPU")
    if "rss" in out:
        r = out["rss"]
        print(f"ratio peak RSS ft sim / libcachesim alone: {r['ratio']:.2f}x ({r['ft_sim_mib']:.0f} MiB vs "
              f"{r['libcachesim_mib']:.0f} MiB)")
    return 0


def _print_row(label: str, r: dict) -> None:
    print(f"  {label:36s} {r['seconds'] * 1e3:9.3f} ms ({r['cpu_seconds'] * 1e3:.3f})  "
          f"{r['accesses_per_s'] / 1e6:6.2f} M accesses/s  misses {r['misses']}")


def _print_ratios(path: str, r: dict) -> None:
    """The race's ratios (back to back, interleaved) with the times they divide."""
    for mode, title in (("", "back to back"), ("interleaved_", "interleaved")):
        print(f"ratio replay speed ours / libcachesim{'' if not mode else ' (' + title + ')'}: "
              f"{r[f'{mode}ours_vs_libcachesim']:.2f}x wall, {r[f'{mode}ours_vs_libcachesim_cpu']:.2f}x CPU; "
              f"ours / the plain loop: {r[f'{mode}ours_vs_plain']:.2f}x wall on {path} ({title}: ours "
              f"{r[f'{mode}ours']['seconds'] * 1e3:.3f} ms, its compiled loop "
              f"{r[f'{mode}ours_loop']['seconds'] * 1e3:.3f} ms, the plain loop {r[f'{mode}plain']['seconds'] * 1e3:.3f} ms, libcachesim "
              f"{r[f'{mode}libcachesim']['seconds'] * 1e3:.3f} ms on its file written beforehand; all given the call "
              f"stream's keys); with its file written in its time: {r[f'{mode}ours_vs_libcachesim_writing']:.2f}x")


def _print_race_table(path: str, out: dict) -> None:
    """One line per raced trace: ours / the plain loop and ours / libcachesim, back to back and interleaved (> 1:
    ours is faster), with our time."""
    print(f"  {'trace':58s} {'accesses':>9s} {'ours ms':>8s}  vs plain b2b / int   vs libcachesim b2b / int")
    for name, r in [(path, out), *out["races"].items()]:
        print(f"  {name[-58:]:58s} {r['accesses']:9d} {r['ours']['seconds'] * 1e3:8.3f}  "
              f"{r['ours_vs_plain']:8.2f}x {r['interleaved_ours_vs_plain']:6.2f}x   "
              f"{r['ours_vs_libcachesim']:10.2f}x {r['interleaved_ours_vs_libcachesim']:6.2f}x")
