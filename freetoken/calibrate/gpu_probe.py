"""The GPU probe of `ft bench bw` (CUDA only): what the cost model charges per kernel and how fast big kernels run.

    launch_us        host time of one launch of a tiny torch op, back to back (the driver's issue cost)
    dispatch_us      extra host time of one of the engine's Triton kernels (rms_norm) over that: Python + Triton's
                     JIT dispatch (an engine input, sim.engines dispatch_us; reported, not applied to the profile)
    sync_us          a tiny op then a device-to-host read of its result, less one launch
    kernel_floor_us  GPU time per node of a captured graph of tiny kernels (start, ramp-up, tail)
    gemm_tflops      a large bf16 GEMM (8192^3), CUDA-event timed
    gemv_gb_s        one token through a 8192 x 28672 bf16 weight (a decode GEMV), bytes read per second
sim.hardware.with_bench_profile turns them into launch_us, sync_us, kernel_floor_us and the efficiencies.
"""

from __future__ import annotations

import time

import torch


def _host_per_call(fn, n: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed / n


def _event_seconds(fn, n: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / n


def gpu_probe(iterations: int = 2000) -> dict:
    from freetoken.kernels import rms_norm

    dev = torch.device("cuda")
    x = torch.zeros(1, 64, device=dev)
    w = torch.ones(64, device=dev)
    for _ in range(10):  # compile and warm up
        rms_norm(x, w, 1e-6)
        x.add_(0)
    launch = _host_per_call(lambda: x.add_(0), iterations)
    triton_launch = _host_per_call(lambda: rms_norm(x, w, 1e-6), iterations)
    synced = _host_per_call(lambda: x.add_(0).sum().item(), iterations // 4)
    stream, nodes = torch.cuda.Stream(), 100
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        x.add_(0)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(nodes):
                x.add_(0)
    floor = _event_seconds(graph.replay, 50) / nodes
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    gemm = _event_seconds(lambda: a @ a, 10)
    wt = torch.randn(28672, 8192, device=dev, dtype=torch.bfloat16)
    v = torch.randn(1, 8192, device=dev, dtype=torch.bfloat16)
    gemv = _event_seconds(lambda: v @ wt.T, 50)
    return {"launch_us": round(launch * 1e6, 3), "dispatch_us": round(max(0.0, triton_launch - launch) * 1e6, 3),
            "sync_us": round(max(0.0, synced - 3 * launch) * 1e6, 3), "kernel_floor_us": round(floor * 1e6, 3),
            "gemm_tflops": round(2 * 8192 ** 3 / gemm / 1e12, 2), "gemv_gb_s": round(wt.numel() * 2 / gemv / 1e9, 1)}
