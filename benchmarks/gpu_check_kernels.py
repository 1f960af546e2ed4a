"""Compile every Triton kernel at Qwen3-30B-A3B shapes, compare each with its torch reference, time both.

    python benchmarks/gpu_check_kernels.py             # on a CUDA machine: real shapes, compiled kernels
    python benchmarks/gpu_check_kernels.py --dry-run   # anywhere: tiny shapes, CPU tensors, Triton interpreter

From another script in benchmarks/: `from gpu_check_kernels import check_kernels; results = check_kernels("cuda")`.
Each result line: max abs error, error relative to the reference's largest value, kernel and reference times, and
for the bandwidth-bound cases the bytes streamed per second; the quantized expert FFN cases (int4, fp8, MXFP4, NVFP4
slots) also their time as a multiple of the unquantized expert_ffn's on the same weights dequantized to --dtype.
On CUDA kernel times are taken with the L2 flushed before each call, inside a CUDA graph where the call can be
captured (kernel_timing.py), and the batch-1 weight reads are reported as % of the measured device-copy bandwidth:
a case with a threshold fails below it (the issue's target: decode linears and expert FFN >= 70%; the small k / v /
router projections are launch-latency bound at any tile shape and are reported without one).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if str(Path(__file__).resolve().parent) not in sys.path:  # loaded by path (tests): its sibling kernel_timing
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_timing import graph_time_ms, measure_hbm_gbps  # noqa: E402


@dataclass(frozen=True, slots=True)
class KernelShapes:
    """Model shapes: D hidden, I expert intermediate, E experts, K picks, H / Hkv heads, Dh head dim."""

    D: int
    I: int
    E: int
    K: int
    H: int
    Hkv: int
    Dh: int
    slots: int  # expert slots resident in GPU memory (one layer's worth)
    vocab: int
    prefill_tokens: int
    context: int  # tokens already in the KV cache for the chunked-prefill and decode cases
    # Gated DeltaNet (Qwen3.5 / 3.6-MoE linear attention): key / value heads and dims, conv kernel
    lin_hk: int = 16
    lin_hv: int = 32
    lin_dk: int = 128
    lin_dv: int = 128
    conv: int = 4

    def __post_init__(self):
        if self.H % self.Hkv or self.K > self.E or min(self.D, self.I, self.Dh, self.slots, self.prefill_tokens) < 1:
            raise ValueError(f"inconsistent kernel shapes: {self}")


QWEN3_30B_A3B = KernelShapes(D=2048, I=768, E=128, K=8, H=32, Hkv=4, Dh=128, slots=128, vocab=151936,
                             prefill_tokens=512, context=4096)
TINY = KernelShapes(D=64, I=40, E=16, K=4, H=4, Hkv=2, Dh=16, slots=10, vocab=100, prefill_tokens=9, context=40,
                   lin_hk=1, lin_hv=2, lin_dk=16, lin_dv=8)


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    kernel: Callable
    reference: Callable
    args: tuple
    bytes_moved: int = 0  # > 0: a bandwidth-bound case, report GB/s
    tolerance: float = 2e-2  # max error relative to the reference's largest magnitude
    baseline: tuple[Callable, tuple] | None = None  # (kernel, args) the kernel's time is compared with
    min_hbm_pct: float = 0.0  # on CUDA: fail below this % of the measured device bandwidth (0: report only)


@dataclass(frozen=True, slots=True)
class KernelResult:
    name: str
    max_abs_err: float
    rel_err: float
    kernel_ms: float
    reference_ms: float
    gbps: float
    ok: bool
    baseline_ms: float = 0.0
    hbm_pct: float = 0.0  # bytes_moved per kernel time as % of the measured device-copy bandwidth (CUDA only)
    graphed: bool = False  # timed inside a CUDA graph (else eager)
    min_hbm_pct: float = 0.0  # the case's threshold (0: report only)
    hbm_gbps: float = 0.0  # the measured device-copy bandwidth the % is of (0 off CUDA)


def _chunked(fn: Callable, chunk: int) -> Callable:
    """Run a token-major reference in chunks of tokens (the einsum reference gathers [T, K, 2I, D] weights)."""
    def run(x, *rest):
        return torch.cat([fn(x[i : i + chunk], *(r[i : i + chunk] for r in rest[:2]), *rest[2:])
                          for i in range(0, x.shape[0], chunk)])
    return run


def _cases(s: KernelShapes, device: str, dtype: torch.dtype) -> list[Case]:
    from freetoken import kernels as K

    g = torch.Generator(device=device).manual_seed(0)  # drawn on the device: CPU draws of 1 GB would take a minute
    on = dict(generator=g, device=device)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, **on) * scale).to(dtype)

    T, L = s.prefill_tokens, s.context
    eb = torch.finfo(dtype).bits // 8
    x = randn(T, s.D)
    w_norm = (torch.rand(s.D, **on) + 0.5).to(dtype)
    q = randn(T, s.H, s.Dh)
    kc, vc = randn(L + T, s.Hkv, s.Dh), randn(L + T, s.Hkv, s.Dh)
    pos = torch.arange(L, L + T, device=device)
    w_qkv = randn((s.H + 2 * s.Hkv) * s.Dh, s.D, scale=s.D**-0.5)
    w_head = randn(s.vocab, s.D, scale=s.D**-0.5)
    w_k, w_router = w_qkv[s.H * s.Dh : (s.H + s.Hkv) * s.Dh], randn(s.E, s.D, scale=s.D**-0.5)  # narrow outputs
    w_o = randn(s.D, s.H * s.Dh, scale=(s.H * s.Dh) ** -0.5)
    w_gate_up = randn(s.slots, 2 * s.I, s.D, scale=s.D**-0.5)
    w_down = randn(s.slots, s.D, s.I, scale=s.I**-0.5)
    logits = randn(T, s.E, scale=2.0)
    slot_ids = torch.randint(-1, s.slots, (T, s.K), dtype=torch.int32, **on)
    route_w = torch.rand(T, s.K, **on)
    decode_slots = torch.randperm(s.slots, **on)[: s.K].to(torch.int32)[None, :]
    expert_bytes = 3 * s.I * s.D * eb
    scale = s.Dh**-0.5
    ffn_ref = _chunked(K.expert_ffn_ref, 16)
    from freetoken.kernels.kv_fp8 import quantize_kv

    (k8, ks), (v8, vs) = quantize_kv(kc), quantize_kv(vc)  # an FP8 KV cache: e4m3 codes + per (token, head) scales
    fp8 = (None, None, ks, vs)  # attention(..., sinks, window, k_scale, v_scale)
    return [
        Case("rms_norm [T, D]", K.rms_norm, K.rms_norm_ref, (x, w_norm, 1e-6)),
        Case("rms_norm q/k [T*H, Dh]", K.rms_norm, K.rms_norm_ref,
             (q.view(T * s.H, s.Dh), w_norm[: s.Dh], 1e-6)),
        Case("apply_rope [T, H, Dh]", K.apply_rope, K.apply_rope_ref, (q, pos, 1e6)),
        Case("attention prefill T from 0", K.attention, K.attention_ref, (q, kc, vc, 0, scale)),
        Case("attention prefill chunk at context", K.attention, K.attention_ref, (q, kc, vc, L, scale)),
        Case("attention decode at context", K.attention, K.attention_ref, (q[:1], kc, vc, L, scale),
             bytes_moved=2 * (L + 1) * s.Hkv * s.Dh * eb),
        Case("attention prefill fp8 kv at context", K.attention, K.attention_ref, (q, k8, v8, L, scale, *fp8)),
        Case("attention decode fp8 kv at context", K.attention, K.attention_ref, (q[:1], k8, v8, L, scale, *fp8),
             bytes_moved=2 * (L + 1) * s.Hkv * (s.Dh + 4), baseline=(K.attention, (q[:1], kc, vc, L, scale))),
        Case("router_topk [T, E]", lambda *a: K.router_topk(*a)[0], lambda *a: K.router_topk_ref(*a)[0],
             (logits, s.K, True), tolerance=1e-3),
        Case("linear fused qkv decode", K.linear, K.linear_ref, (x[:1], w_qkv), bytes_moved=w_qkv.numel() * eb,
             min_hbm_pct=70),
        Case("linear k decode (split-K)", K.linear, K.linear_ref, (x[:1], w_k), bytes_moved=w_k.numel() * eb),
        Case("linear router decode (split-K)", K.linear, K.linear_ref, (x[:1], w_router),
             bytes_moved=w_router.numel() * eb),
        Case("linear o decode", K.linear, K.linear_ref, (q[:1].reshape(1, -1), w_o), bytes_moved=w_o.numel() * eb,
             min_hbm_pct=70),
        Case("linear qkv prefill", K.linear, K.linear_ref, (x, w_qkv)),
        Case("linear lm_head decode", K.linear, K.linear_ref, (x[:1], w_head), bytes_moved=w_head.numel() * eb,
             min_hbm_pct=70),
        Case("expert_ffn decode K slots", K.expert_ffn, ffn_ref,
             (x[:1], decode_slots, route_w[:1], w_gate_up, w_down), bytes_moved=s.K * expert_bytes, min_hbm_pct=70),
        Case("expert_ffn prefill with misses", K.expert_ffn, ffn_ref, (x, slot_ids, route_w, w_gate_up, w_down)),
        *_quant_ffn_cases(s, device, dtype, g),
        *_deltanet_cases(s, device, dtype, g),
    ]


def _fresh_state(fn: Callable, state_arg: int) -> Callable:
    """The DeltaNet kernels update their state in place: each call (kernel, reference, timing) gets a copy."""
    def run(*args):
        args = list(args)
        args[state_arg] = args[state_arg].clone()
        return fn(*args)
    return run


def _deltanet_cases(s: KernelShapes, device: str, dtype: torch.dtype, g: torch.Generator) -> list[Case]:
    """Gated DeltaNet at Qwen3.6-35B-A3B's linear-attention shapes: conv over q, k, v channels, the chunked rule in
    prefill from a non-zero state, the recurrent step in decode (bandwidth: the fp32 state read and written)."""
    from freetoken import kernels as K

    T, Hk, Hv, Dk, Dv = s.prefill_tokens, s.lin_hk, s.lin_hv, s.lin_dk, s.lin_dv
    C = 2 * Hk * Dk + Hv * Dv
    on = dict(generator=g, device=device)
    x = torch.randn(T, C, **on).to(dtype)
    w_conv = (torch.randn(C, s.conv, **on) * 0.5).to(dtype)
    conv_state = torch.randn(C, s.conv - 1, **on).to(dtype)
    q, k = torch.randn(T, Hk, Dk, **on).to(dtype), torch.randn(T, Hk, Dk, **on).to(dtype)
    v = torch.randn(T, Hv, Dv, **on).to(dtype)
    gate = -torch.nn.functional.softplus(torch.randn(T, Hv, **on))
    beta = torch.sigmoid(torch.randn(T, Hv, **on)).to(dtype)
    state = torch.randn(Hv, Dk, Dv, **on) * 0.1
    z = torch.randn(T * Hv, Dv, **on).to(dtype)
    w_norm = (torch.rand(Dv, **on) + 0.5).to(dtype)
    state_bytes = 2 * Hv * Dk * Dv * 4
    return [
        Case("causal_conv1d prefill [T, C]", _fresh_state(K.causal_conv1d, 2), _fresh_state(K.causal_conv1d_ref, 2),
             (x, w_conv, conv_state)),
        Case("causal_conv1d_update [1, C]", _fresh_state(K.causal_conv1d_update, 2),
             _fresh_state(K.causal_conv1d_update_ref, 2), (x[:1].contiguous(), w_conv, conv_state)),
        Case("gated_delta_chunk prefill", _fresh_state(K.gated_delta_chunk, 5),
             _fresh_state(K.gated_delta_chunk_ref, 5), (q, k, v, gate, beta, state)),
        Case("gated_delta_step decode", _fresh_state(K.gated_delta_step, 5), _fresh_state(K.gated_delta_step_ref, 5),
             (q[:1], k[:1], v[:1], gate[:1], beta[:1], state), bytes_moved=state_bytes),
        Case("rms_norm_gated [T*Hv, Dv]", K.rms_norm_gated, K.rms_norm_gated_ref,
             (v.reshape(T * Hv, Dv), z, w_norm, 1e-6)),
    ]


def _quant_ffn_cases(s: KernelShapes, device: str, dtype: torch.dtype, g: torch.Generator) -> list[Case]:
    """expert_ffn_quant per packed kind on S = 16 slots (decode: T = 1, prefill: T = 256 with misses), timed against
    the unquantized expert_ffn on the same weights dequantized to `dtype`."""
    from freetoken import kernels as K
    from freetoken.kernels.expert_ffn_quant import dequantize_experts
    from freetoken.kernels.packed_random import random_packed

    D, I, S = s.D, s.I // 32 * 32, min(16, s.slots)  # group sizes up to 32 divide I
    group = 128 if D % 128 == 0 and I % 128 == 0 else 32
    layouts = {
        f"int4 g{group}": ("int4", {"group": group}),
        "fp8 b128": ("fp8", {"block": (128, 128)}),
        "mxfp4": ("fp4", {"group": 32, "scale_code": "e8m0"}),
        "nvfp4": ("fp4", {"group": 16, "scale_code": "e4m3", "global_op": "divide"}),
    }
    T = min(256, s.prefill_tokens)
    x = torch.randn(T, D, generator=g, device=device).to(dtype)
    route_w = torch.rand(T, s.K, generator=g, device=device)
    decode_slots = torch.randperm(S, generator=g, device=device)[: s.K].to(torch.int32)[None, :]
    slot_ids = torch.randint(-1, S, (T, s.K), dtype=torch.int32, generator=g, device=device)
    ref = _chunked(K.expert_ffn_quant_ref, 16)
    out = []
    for name, (kind, layout) in layouts.items():
        gate, up = (random_packed(kind, S, (I, D), g, device, **layout) for _ in range(2))
        down = random_packed(kind, S, (D, I), g, device, **layout)
        w_gate_up, w_down = (w.to(dtype) for w in dequantize_experts(gate, up, down))
        packed_bytes = sum(w.nbytes_per_slot for w in (gate, up, down))
        for case, args, moved in (("T=1", (x[:1], decode_slots, route_w[:1]), s.K * packed_bytes),
                                  (f"T={T}", (x, slot_ids, route_w), 0)):
            out.append(Case(f"expert_ffn_quant {name} {case}", K.expert_ffn_quant, ref, (*args, gate, up, down),
                            bytes_moved=moved, baseline=(K.expert_ffn, (*args, w_gate_up, w_down)),
                            min_hbm_pct=50 if moved else 0))  # packed: dequant ALU work beside the reads
    return out


def _time_ms(fn: Callable, args: tuple, device: str, iters: int) -> float:
    if device.startswith("cuda"):
        for _ in range(3):
            fn(*args)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn(*args)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn(*args)
    return (time.perf_counter() - t0) * 1e3 / iters


def check_kernels(device: str = "cuda", dtype: torch.dtype = torch.bfloat16, dry_run: bool = False,
                  shapes: KernelShapes | None = None, iters: int = 20) -> list[KernelResult]:
    """Run every case, print one line each, return the results (ok = error within the case's tolerance)."""
    shapes = shapes or (TINY if dry_run else QWEN3_30B_A3B)
    if dry_run:
        device, iters = "cpu", 1
        if "freetoken.kernels" not in sys.modules:  # interpret even on a CUDA machine (read at kernel definition)
            os.environ["TRITON_INTERPRET"] = "1"
        elif not sys.modules["freetoken.kernels.checks"].interpreting():
            raise ValueError("dry_run: freetoken.kernels was imported compiled; CPU tensors need TRITON_INTERPRET=1")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device: CUDA is not available here (use --dry-run on a CPU machine)")
    results = []
    dtype_name = str(dtype).removeprefix("torch.")
    hbm = measure_hbm_gbps(device)
    if hbm:
        print(f"device copy bandwidth {hbm:.0f} GB/s (read + write); kernel times: L2 flushed, CUDA graphs (g)")
    print(f"{'kernel':38s} {'max abs err':>11s} {'rel err':>9s} {'kernel ms':>10s} {'ref ms':>9s} {'GB/s':>7s} "
          f"{'%HBM':>5s}")
    with torch.no_grad():
        for case in _cases(shapes, device, dtype):
            out = case.kernel(*case.args)
            ref = case.reference(*case.args)
            err = (out.float() - ref.float()).abs().max().item()
            rel = err / max(ref.float().abs().max().item(), 1e-30)
            kernel_ms, graphed = graph_time_ms(case.kernel, case.args, device, iters)
            ref_ms = _time_ms(case.reference, case.args, device, max(1, iters // 4))
            gbps = case.bytes_moved / (kernel_ms * 1e6) if case.bytes_moved else 0.0
            pct = 100 * gbps / hbm if hbm and case.bytes_moved else 0.0
            base_ms = graph_time_ms(*case.baseline, device, iters)[0] if case.baseline else 0.0
            ok = passes(rel, case.tolerance, pct, case.min_hbm_pct, hbm)
            res = KernelResult(case.name, err, rel, kernel_ms, ref_ms, gbps, ok, base_ms, pct, graphed,
                               case.min_hbm_pct, hbm)
            results.append(res)
            bandwidth = f"{gbps:7.0f}" if case.bytes_moved else f"{'-':>7s}"
            share = f"{pct:5.0f}" if pct else f"{'-':>5s}"
            limit = f" (min {case.min_hbm_pct:.0f}%)" if hbm and case.min_hbm_pct else ""
            versus = f"  {kernel_ms / base_ms:5.2f}x the {dtype_name} kernel ({base_ms:.4f} ms)" if base_ms else ""
            print(f"{res.name:38s} {err:11.3e} {rel:9.2e} {kernel_ms:10.4f}{'g' if graphed else ' '} {ref_ms:8.3f} "
                  f"{bandwidth} {share} {'ok' if res.ok else 'FAIL'}{limit}{versus}")
    return results


def passes(rel_err: float, tolerance: float, hbm_pct: float, min_hbm_pct: float, hbm_gbps: float) -> bool:
    """Right within the tolerance, and (where a device bandwidth was measured) at or above the case's % of it."""
    return rel_err <= tolerance and (not hbm_gbps or hbm_pct >= min_hbm_pct)


def write_summary(results: list[KernelResult], path: Path) -> dict:
    """The run as JSON: verdict (FAIL when any case is wrong or under its bandwidth threshold), failing case names,
    one row per case."""
    import json

    from freetoken.io import write_atomic

    bad = [r.name for r in results if not r.ok]
    summary = {"verdict": "FAIL" if bad else "PASS", "failures": bad, "kernels": [asdict(r) for r in results]}
    write_atomic(path, json.dumps(summary, indent=1))  # an interrupted run leaves the last summary whole
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU under the Triton interpreter")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--json", metavar="PATH", help="summary JSON (default: $OUT/gpu_check_kernels.json when $OUT is set)")
    args = p.parse_args(argv)
    try:
        results = check_kernels(dtype=getattr(torch, args.dtype), dry_run=args.dry_run)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    path = args.json or (Path(os.environ["OUT"]) / "gpu_check_kernels.json" if os.environ.get("OUT") else None)
    if path is not None:
        write_summary(results, Path(path))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
