"""Capturing a CUDA graph without torch.cuda.graph's per-capture housekeeping: its __enter__ synchronizes the
device, empties the caching allocator and the host cache (and runs gc.collect where torch.compiler's
force_cudagraph_gc is set) before every capture, 48 times at a two-layer-kind model's first decode step. Here a
capture orders its stream after the current one (no host wait), reserves the buffers kernels would otherwise first
allocate inside the capture (the split-K tile counters), and captures with capture_begin / capture_end."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from freetoken.kernels.linear_decode import reserve_tile_counters


@contextmanager
def capture(graph: "torch.cuda.CUDAGraph", stream: "torch.cuda.Stream", pool=None) -> Iterator[None]:
    """Records the work issued inside the block into `graph` on `stream` (nothing runs)."""
    device = stream.device
    reserve_tile_counters(device, stream)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=pool, capture_error_mode="global")
        try:
            yield
        finally:
            graph.capture_end()
    torch.cuda.current_stream(device).wait_stream(stream)
