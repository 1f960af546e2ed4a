"""Kernel times as a decode step sees them: L2 flushed before every run, launched from a CUDA graph where the call
can be captured (eager otherwise, said in the result), and the device's own copy bandwidth to compare them with.

    graph_time_ms(fn, args)  # ms per call, cold L2, and whether a graph held it
    measure_hbm_gbps()       # read + write bytes of a 1 GiB device copy per second
On CPU (dry runs) both fall back to wall-clock timing and report no bandwidth.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

L2_FLUSH_BYTES = 256 << 20  # well above any L2 (H100 / H200: 50-60 MB): writing it evicts the kernel's weights


def measure_hbm_gbps(device: str = "cuda", nbytes: int = 1 << 30, iters: int = 5) -> float:
    """Device memory bandwidth (GB/s) of a large copy, read + write counted; 0.0 off CUDA."""
    if not device.startswith("cuda"):
        return 0.0
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(iters):
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end))
    del src, dst
    return 2 * nbytes / (best * 1e-3) / 1e9


def _replay_ms(graph: torch.cuda.CUDAGraph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()  # first replay uploads the graph
    torch.cuda.synchronize()
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def _captured(body: Callable[[], None], stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        body()
    return graph


def graph_time_ms(fn: Callable, args: tuple, device: str = "cuda", iters: int = 20) -> tuple[float, bool]:
    """(ms per call with a cold L2, captured in a CUDA graph?). On CUDA: a graph of `iters` x (flush, call) minus a
    graph of `iters` flushes; if the call cannot be captured, per-call events around eager calls after a flush."""
    if not device.startswith("cuda"):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(*args)
        return (time.perf_counter() - t0) * 1e3 / iters, False
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):  # warm up where the graph is captured (per-stream buffers, autotuning, JIT)
        for _ in range(3):
            fn(*args)
    torch.cuda.synchronize()
    try:
        def both():
            for _ in range(iters):
                flush.zero_()
                fn(*args)

        def flushes():
            for _ in range(iters):
                flush.zero_()

        with_calls, only_flush = _captured(both, stream), _captured(flushes, stream)
        ms = (_replay_ms(with_calls) - _replay_ms(only_flush)) / iters
        return max(ms, 1e-6), True
    except RuntimeError:  # not capturable (a host sync inside): eager, one flush before each timed call
        torch.cuda.synchronize()
    total = 0.0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(iters):
        flush.zero_()
        start.record()
        fn(*args)
        end.record()
        torch.cuda.synchronize()
        total += start.elapsed_time(end)
    return total / iters, False
