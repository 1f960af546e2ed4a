"""GPU device check: compile every kernel, then decode on a random-weight model shaped like Qwen3-30B-A3B with
the expert cache at 37% of all experts, for lru+offload, lru+hybrid, static_layers+cpu and frequency+cpu.

    python benchmarks/gpu_check.py             # one CUDA GPU, about 2 minutes on an H100
    python benchmarks/gpu_check.py --dry-run   # anywhere: the same code on a tiny shape on CPU

First the fully resident baseline's decode tok/s (every expert in a slot: the ceiling the configurations approach).
Per configuration: decode tok/s, hit rate, and the achieved fraction of the roofline: measured per-token time vs
fetched bytes / PCIe BW + bytes the GPU reads (resident and fetched experts, dense weights) / HBM BW
(+ CPU-lane expert bytes / host BW, shown apart), each bandwidth measured in this run.
Verdict: every configuration's teacher-forced logits (the fully resident baseline's greedy continuation fed back
token by token) are compared with that baseline's (max |delta|, argmax agreement, thresholds in TOLERANCE) on an
fp32 model of the same widths at LOGITS_LAYERS layers (the bf16 48-layer rows report their drift: bf16 rounding
through 48 random layers moves logits past any fixed bound between any two summation orders); any kernel failure or
a configuration outside them exits 1, and the summary goes to $OUT/gpu_check.json when $OUT is set (or --json PATH).
Paths: every configuration decides on the device (`placement="device"`: one Triton program per MoE call, experts
gathered from pinned host memory, the MoE blocks replayed as CUDA graphs, in parts around a CPU lane); lru+offload
runs once more on the host path, eager, and its logits must match the device path's (PATH_TOLERANCE, fp32), its
syncs per decode step are reported beside the device path's, and once more on the device path eagerly (--eager):
tok/s with and without the CUDA graphs, same placement, same logits; a graph-capable configuration whose graphs never
replayed fails.
Weights: benchmarks/random_model.py (in memory, one host expert tensor shared by every layer unless
--distinct-layers).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: make the repo and benchmarks/ importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from random_model import QWEN3_30B_A3B, TINY, Shape, free_device_memory, random_checkpoint  # noqa: E402


CONFIGS = (("lru", "offload"), ("lru", "hybrid"), ("static_layers", "cpu"), ("frequency", "cpu"))
FRACTION = 0.37
LOGITS_LAYERS = 4  # depth of the fp32 model the logits verdict runs on (the GPU check's widths)
# (max |logit delta| relative to the baseline's largest |logit|, least argmax agreement) per compute dtype: fp32 lanes
# differ only in summation order (the verdict); bf16's bound marks drift in the report only (run_check says why)
TOLERANCE = {"float32": (1e-4, 1.0), "bfloat16": (2e-2, 0.95)}
PATH_TOLERANCE = dict(TOLERANCE)  # host path vs device path, same config: summation order only
HOST_PATH = ("lru", "offload")


def bandwidths(store, device: str) -> dict[str, float]:
    """GB/s: pinned host -> device expert copies by the copy engine (pcie) and by the fetch path's gather kernel
    reading pinned memory (gather), device memory (read + write of a copy), CPU-lane expert reads."""
    eb = store.expert_bytes
    n = min(store.num_experts, 32)
    out = {}
    if device.startswith("cuda"):
        dst_gu = torch.empty((n,) + tuple(store.gate_up[0].shape[1:]), dtype=store.dtype, device=device)
        dst_d = torch.empty((n,) + tuple(store.down[0].shape[1:]), dtype=store.dtype, device=device)

        def h2d():
            dst_gu.copy_(store.gate_up[0][:n], non_blocking=True)
            dst_d.copy_(store.down[0][:n], non_blocking=True)

        out["pcie"] = n * eb / _cuda_time(h2d) / 1e9
        from freetoken.kernels.expert_gather import gather_pairs  # the fetch path's zero-copy gather, same bytes

        ids = torch.arange(n, dtype=torch.int32, device=device)
        count = torch.full((1,), n, dtype=torch.int64, device=device)
        pairs = [(store.gate_up[0], dst_gu), (store.down[0], dst_d)]
        out["gather"] = n * eb / _cuda_time(lambda: gather_pairs(pairs, ids, ids, count)) / 1e9
        buf = torch.empty(1 << 30, dtype=torch.uint8, device=device)
        other = torch.empty_like(buf)
        out["hbm"] = 2 * buf.numel() / _cuda_time(lambda: other.copy_(buf)) / 1e9
    x = torch.randn((1, store.hidden)).to(store.dtype)

    def cpu_lane():
        for e in range(n):
            h = x @ store.gate_up[0][e].T
            (h[:, :store.intermediate] * h[:, store.intermediate:]) @ store.down[0][e].T

    cpu_lane()
    t0 = time.perf_counter()
    cpu_lane()
    out["host"] = n * eb / (time.perf_counter() - t0) / 1e9
    return out


def _cuda_time(fn, iters: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def dense_bytes_per_token(ckpt) -> int:
    """Weights the GPU reads every decode step besides the experts: all dense tensors but the embedding table."""
    return sum(t.numel() * t.element_size() for n, t in ckpt.dense.items() if n != "model.embed_tokens.weight")


def teacher_forced_logits(engine, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """Logits [n, V] fp32 on the host: the prompt's last position, then after each continuation token but the last."""
    kv = engine.new_kv(len(prompt) + len(continuation) + 8)
    rows = [engine.prefill(prompt, kv, request=2)[-1]]
    for token in continuation[:-1]:
        rows.append(engine.decode(token, kv, request=2)[-1])
    return torch.stack(rows).float().cpu()  # one host copy


def compare_logits(got: torch.Tensor, base: torch.Tensor) -> dict:
    return {"max_abs_delta": float((got - base).abs().max()), "scale": float(base.abs().max()),
            "argmax_agreement": float((got.argmax(-1) == base.argmax(-1)).float().mean())}


def decode_run(ckpt, policy: str, split_mode: str, bw: dict, options: dict, args, device: str,
               forced: tuple[list[int], list[int]] | None = None, fraction: float = FRACTION,
               placement: str = "device", eager: bool = False) -> dict:
    from freetoken.engine import CacheConfig, Engine, SamplingParams
    from freetoken.engine.engine import COUNTED_STEP
    from freetoken.placement import Split

    bp, bh = bw.get("pcie", 1.0), bw["host"]
    split = Split(split_mode, bp=bp, bh=bh) if split_mode == "hybrid" else Split(split_mode)
    engine = Engine(ckpt, CacheConfig(policy, fraction=fraction, split=split, options=options),
                    kernels=args.kernels, device=device, max_context=args.prompt + args.tokens + 8,
                    placement=placement, eager=eager)
    prompt = torch.randint(0, ckpt.config.vocab_size, (args.prompt,), generator=torch.Generator().manual_seed(1))
    sampling = SamplingParams(greedy=True)
    # warm-up: compile, fill, capture the graphs, and count one decode token's kernels (engine/launch_count.py),
    # whose eager counted step stays out of the timed run
    engine.count_launches = engine.kernels.name == "triton"
    list(engine.generate(prompt.tolist(), sampling, max_tokens=COUNTED_STEP + 3, stop_token_ids=[]))
    engine.count_launches = False
    before = engine.cache.decode_counters.to_dict()
    syncs0, replays0 = engine.host.syncs, engine.graphs.replays if engine.graphs is not None else 0
    engine.stats = type(engine.stats)()
    out_tokens = list(engine.generate(prompt.tolist()[::-1], sampling, max_tokens=args.tokens, stop_token_ids=[],
                                      request=1))
    n = len(out_tokens)
    syncs, replays = engine.host.syncs - syncs0, (engine.graphs.replays if engine.graphs is not None else 0) - replays0
    after = engine.cache.decode_counters.to_dict()
    d = {k: after[k] - before[k] for k in ("hits", "fetched", "cpu", "accesses", "fetched_bytes")}
    s = engine.stats
    steps = max(s.decode_tokens, 1)
    eb = engine.store.expert_bytes
    t_tok = s.decode_s / steps  # measured seconds per decode step
    fetched_b = d["fetched_bytes"] / steps  # per decode step
    gpu_b = (d["hits"] + d["fetched"]) * eb / steps + dense_bytes_per_token(ckpt)
    cpu_b = d["cpu"] * eb / steps
    t_gpu = fetched_b / (bw.get("pcie", 0) * 1e9 or float("inf")) + gpu_b / (bw.get("hbm", 0) * 1e9 or float("inf"))
    t_cpu = cpu_b / (bh * 1e9)
    row = {"policy": policy, "split": split_mode, "tokens": n, "tok_s": s.decode_tok_s,
            "hit_rate": d["hits"] / max(d["accesses"], 1), "decode_hits": d["hits"], "decode_accesses": d["accesses"], "capacity": engine.cache.capacity,
            "roofline_gpu": t_gpu / t_tok if t_tok else 0.0, "roofline_all": (t_gpu + t_cpu) / t_tok if t_tok else 0.0,
            "placement": engine.cache.placement_line, "decode_mode": engine.decode_line,
            "graph_capable": engine.graphs is not None, "graph_replays": replays,
            "syncs_per_step": syncs / max(n, 1),  # prefill's and the decode steps' over the measured request
            "kernels_per_layer": c.kernels_per_moe_layer if (c := engine.step_count) else None,
            "kernels_per_token": c.kernels if c else None, "host_syncs_per_token": c.token_syncs if c else None,
            "trace": engine.trace(), "continuation": out_tokens,
            "logits": None if forced is None else teacher_forced_logits(engine, *forced)}
    del engine
    free_device_memory()
    return row


def quant_memory_check(device: str, dry_run: bool) -> list:
    """Slot pools of every expert format (Qwen3-30B-A3B expert, 64 slots): device memory used / the cost model's
    bytes. Dry run: a 128x128 expert, 4 slots, RSS left untuned (figures printed, not meaningful)."""
    from freetoken.quant.measure import measure_all

    shape, slots = ((128, 128), 4) if dry_run else ((QWEN3_30B_A3B.hidden, QWEN3_30B_A3B.intermediate), 64)
    rows = measure_all(*shape, slots, device, pin_malloc=False)
    print(f"quantized slot pools, {slots} x D {shape[0]} I {shape[1]}, {rows[0].method} / expected: "
          + ", ".join(f"{r.name} {r.ratio:.3f}" for r in rows), flush=True)
    return rows


def run_check(dry_run: bool = False, kernels: str = "triton", tokens: int = 32, prompt: int = 16,
              check_kernel_suite: bool = True, distinct_layers: bool = False, failures: list | None = None,
              paths: dict | None = None, report: dict | None = None, rows: list | None = None) -> list[dict]:
    """Rows per configuration; what failed is appended to `failures` (one line each); `paths` gets the host-path
    run beside its device-path twin; `report` the resident baseline's figures, graphs vs eager and, on a GPU, the
    fp32 logits verdict (`fp32_logits`)."""
    failures = [] if failures is None else failures
    paths = {} if paths is None else paths
    report = {} if report is None else report
    rows = [] if rows is None else rows
    device = "cpu" if dry_run else "cuda"
    if not dry_run and not torch.cuda.is_available():
        raise ValueError("no CUDA device here: run with --dry-run on a CPU machine")
    args = argparse.Namespace(kernels=kernels, tokens=tokens, prompt=prompt, distinct_layers=distinct_layers)
    if check_kernel_suite:
        from gpu_check_kernels import check_kernels

        results = check_kernels(device, torch.float32 if dry_run else torch.bfloat16, dry_run=dry_run)
        bad = [r.name for r in results if not r.ok]
        print(f"kernels: {len(results) - len(bad)}/{len(results)} ok" + (f"; FAIL: {', '.join(bad)}" if bad else ""))
        failures += [f"kernel {name}" for name in bad]
    quant_memory_check(device, dry_run)
    if dry_run:  # fp32 already: these rows carry the logits verdict
        return run_phase(TINY, torch.float32, args, device, failures, paths, report, rows, verdict=True)
    # bf16 at full depth measures speed; its rounding, amplified through 48 random layers, moves teacher-forced
    # logits by ~6% of their scale between any two summation orders (host vs device path included), so the logits
    # verdict comes from the same widths in fp32 at LOGITS_LAYERS, where only summation order differs
    run_phase(QWEN3_30B_A3B, torch.bfloat16, args, device, failures, paths, report, rows, verdict=False)
    exact: dict = {"layers": LOGITS_LAYERS, "host_path": {}}
    exact["configs"] = run_phase(replace(QWEN3_30B_A3B, layers=LOGITS_LAYERS), torch.float32, args, device, failures,
                                 exact["host_path"], exact, [], verdict=True)
    report["fp32_logits"] = exact
    return rows


def run_phase(shape: Shape, dtype: torch.dtype, args, device: str, failures: list, paths: dict, report: dict,
              rows: list, verdict: bool) -> list[dict]:
    """The resident baseline, then every configuration: tok/s, hit rate, roofline, logits vs the baseline; only a
    `verdict` phase turns logits outside TOLERANCE into failures (the others report them)."""
    from freetoken.engine.slots import ExpertStore
    from freetoken.trace.stats import expert_counts

    checked = failures if verdict else []
    t0 = time.perf_counter()
    ckpt = random_checkpoint(shape, dtype, device, args.distinct_layers)
    bw = bandwidths(ExpertStore(ckpt.experts), device)
    what = f"{shape.layers} layers, {str(dtype).removeprefix('torch.')}"
    print(f"model ({what}) built in {time.perf_counter() - t0:.1f} s; bandwidths GB/s: "
          + ", ".join(f"{k} {v:.1f}" for k, v in bw.items()))
    base = decode_run(ckpt, "lru", "offload", bw, {}, args, device, fraction=1.0)  # every expert resident
    report["baseline"] = {k: base[k] for k in ("tok_s", "capacity", "syncs_per_step", "graph_replays", "decode_mode",
                                               "roofline_gpu", "kernels_per_layer", "kernels_per_token",
                                               "host_syncs_per_token")}
    print(f"resident baseline (every expert in a slot): {base['tok_s']:.2f} tok/s = {base['roofline_gpu']:.1%} of "
          f"the HBM roofline, {base['syncs_per_step']:.1f} syncs/step ({base['decode_mode']})", flush=True)
    prompt_ids = torch.randint(0, ckpt.config.vocab_size, (args.prompt,), generator=torch.Generator().manual_seed(2))
    forced = (prompt_ids.tolist(), base["continuation"])
    base_logits = teacher_forced_logits_of(ckpt, bw, args, device, forced)
    rel_tol, min_agree = TOLERANCE[str(dtype).removeprefix("torch.")]
    profile = None
    print(f"{'policy':14s} {'split':8s} {'slots':>6s} {'tok/s':>8s} {'hit rate':>9s} {'roofline':>9s} {'+cpu':>6s}")
    for policy, split in CONFIGS:
        options = {"profile": profile} if policy == "frequency" else {}
        try:
            row = decode_run(ckpt, policy, split, bw, options, args, device, forced)
        except Exception as e:  # one broken configuration must not hide the others' figures
            traceback.print_exc()
            failures.append(f"{what}: {policy}+{split}: {type(e).__name__}: {e}")
            continue
        if profile is None:
            profile = expert_counts(row["trace"])  # frequency pins what the first run used most
        logits = row.pop("logits")
        row.update(compare_logits(logits, base_logits))
        del row["trace"], row["continuation"]
        if row["graph_capable"] and row["graph_replays"] == 0:
            failures.append(f"{what}: {policy}+{split}: CUDA graphs captured but never replayed")
        if (policy, split) == HOST_PATH:
            for name, check in (("host_path", host_path_check), ("graph_vs_eager", graph_eager_check)):
                try:
                    out = check(ckpt, bw, args, device, forced, logits, row, checked)
                except Exception as e:
                    traceback.print_exc()
                    failures.append(f"{what}: {name}: {type(e).__name__}: {e}")
                    continue
                paths.update(out) if name == "host_path" else report.__setitem__(name, out)
        if row["max_abs_delta"] > rel_tol * row["scale"] or row["argmax_agreement"] < min_agree:
            checked.append(f"{what}: {policy}+{split}: logits vs resident max |delta| {row['max_abs_delta']:.3g} "
                           f"(limit {rel_tol * row['scale']:.3g}), argmax agreement {row['argmax_agreement']:.3f} "
                           f"(limit {min_agree})")
        rows.append(row)
        print(f"{policy:14s} {split:8s} {row['capacity']:6d} {row['tok_s']:8.2f} {row['hit_rate']:9.1%} "
              f"{row['roofline_gpu']:9.1%} {row['roofline_all']:6.1%}  logits |d| {row['max_abs_delta']:.2g} "
              f"argmax {row['argmax_agreement']:.0%}  kernels/layer {row['kernels_per_layer']} "
              f"syncs/token {row['host_syncs_per_token']}", flush=True)
    return rows


def host_path_check(ckpt, bw: dict, args, device: str, forced, device_logits: torch.Tensor, device_row: dict,
                    failures: list) -> dict:
    """The same configuration on the host path (host placement, eager): logits vs the device path's, syncs."""
    row = decode_run(ckpt, *HOST_PATH, bw, {}, args, device, forced, placement="host", eager=True)
    cmp = compare_logits(row.pop("logits"), device_logits)
    rel_tol, min_agree = PATH_TOLERANCE[str(ckpt.experts[0][0].dtype).removeprefix("torch.")]
    if cmp["max_abs_delta"] > rel_tol * cmp["scale"] or cmp["argmax_agreement"] < min_agree:
        failures.append(f"{'+'.join(HOST_PATH)}: host path vs device path max |delta| {cmp['max_abs_delta']:.3g}, "
                        f"argmax agreement {cmp['argmax_agreement']:.3f}")
    out = {"config": list(HOST_PATH), **cmp, "host_tok_s": row["tok_s"], "device_tok_s": device_row["tok_s"],
           "host_syncs_per_step": row["syncs_per_step"], "device_syncs_per_step": device_row["syncs_per_step"],
           "device_decode_mode": device_row["decode_mode"]}
    print(f"host path {'+'.join(HOST_PATH)}: {row['tok_s']:.2f} tok/s, {row['syncs_per_step']:.1f} syncs/step vs "
          f"device {device_row['tok_s']:.2f} tok/s, {device_row['syncs_per_step']:.1f} syncs/step "
          f"({device_row['decode_mode']}); logits |d| {cmp['max_abs_delta']:.2g}", flush=True)
    return out


def graph_eager_check(ckpt, bw: dict, args, device: str, forced, graph_logits: torch.Tensor, graph_row: dict,
                      failures: list) -> dict:
    """The same configuration on the same (device) placement, eager: what the CUDA graphs alone change in tok/s,
    and that they change no logit beyond summation order (PATH_TOLERANCE)."""
    row = decode_run(ckpt, *HOST_PATH, bw, {}, args, device, forced, eager=True)
    cmp = compare_logits(row.pop("logits"), graph_logits)
    rel_tol, min_agree = PATH_TOLERANCE[str(ckpt.experts[0][0].dtype).removeprefix("torch.")]
    if cmp["max_abs_delta"] > rel_tol * cmp["scale"] or cmp["argmax_agreement"] < min_agree:
        failures.append(f"{'+'.join(HOST_PATH)}: graphs vs eager max |delta| {cmp['max_abs_delta']:.3g}, "
                        f"argmax agreement {cmp['argmax_agreement']:.3f}")
    speedup = graph_row["tok_s"] / row["tok_s"] if row["tok_s"] else 0.0
    out = {"config": list(HOST_PATH), **cmp, "graph_tok_s": graph_row["tok_s"], "eager_tok_s": row["tok_s"],
           "speedup": speedup, "graph_replays": graph_row["graph_replays"], "eager_replays": row["graph_replays"],
           "graph_decode_mode": graph_row["decode_mode"], "eager_decode_mode": row["decode_mode"]}
    print(f"graphs vs eager {'+'.join(HOST_PATH)}, device placement: {graph_row['tok_s']:.2f} vs {row['tok_s']:.2f} "
          f"tok/s (x{speedup:.2f}; {graph_row['graph_replays']} replays; {graph_row['decode_mode']}); "
          f"logits |d| {cmp['max_abs_delta']:.2g}", flush=True)
    return out


def teacher_forced_logits_of(ckpt, bw: dict, args, device: str, forced) -> torch.Tensor:
    """The fully resident baseline's teacher-forced logits."""
    return decode_run(ckpt, "lru", "offload", bw, {}, args, device, forced, fraction=1.0)["logits"]


def summary_path(explicit: str | None) -> Path | None:
    import os

    if explicit:
        return Path(explicit)
    return Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else None


def versions() -> dict:
    import platform

    import triton

    out = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "cpu": platform.processor() or platform.machine()}
    if torch.cuda.is_available():
        out.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="tiny shape on CPU (Triton interpreter)")
    p.add_argument("--kernels", choices=["triton", "reference"], default="triton")
    p.add_argument("--tokens", type=int, default=32, help="decode tokens per configuration")
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    p.add_argument("--skip-kernel-check", action="store_true")
    p.add_argument("--distinct-layers", action="store_true", help="separate host experts per layer (48x memory)")
    p.add_argument("--json", metavar="PATH", help="summary JSON (default: $OUT/gpu_check.json when $OUT is set)")
    a = p.parse_args(argv)
    failures: list[str] = []
    paths: dict = {}
    report: dict = {}
    rows: list[dict] = []
    try:
        rows = run_check(a.dry_run, a.kernels, a.tokens, a.prompt, not a.skip_kernel_check, a.distinct_layers,
                         failures, paths, report, rows)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # the summary still records what ran before it
        traceback.print_exc()
        failures.append(f"run stopped: {type(e).__name__}: {e}")
    path = summary_path(a.json)
    if path is not None:  # atomic: an interrupted run leaves the last summary whole
        import json

        from freetoken.io import write_atomic

        write_atomic(path, json.dumps({"verdict": "FAIL" if failures else "PASS", "failures": failures,
                                       "configs": rows, "host_path": paths, **report, "versions": versions(),
                                       "dry_run": a.dry_run}, indent=1))
    print(("FAIL:\n  " + "\n  ".join(failures)) if failures else "PASS", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
