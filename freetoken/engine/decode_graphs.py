"""CUDA graphs of the decode step's MoE blocks: per MoE layer and batch size, router + top-k, the recorder's write,
the device placement, the expert gather and the expert FFNs, captured once and replayed (one launch per layer).

Attention stays eager (its kernels take the context length as an argument). A block is captured on its first use
at a fixed batch size, right after running it eagerly (which compiles its kernels and does that step's real work;
capture itself executes nothing). Its input is a static buffer the step copies h into; its output, the graph's own.
Graphs need CUDA and the device placement, and no host read inside the block: a split with a CPU lane or kept
plans run eagerly. Without CUDA the same static buffers are prepared and the block runs eagerly through them
(`capture=False`), which is what the CPU tests exercise.
"""

from __future__ import annotations

from typing import Callable

import torch

from freetoken.engine.graph_capture import capture
from freetoken.engine.host_counters import HostCounters
from freetoken.engine.launch_count import counting

BATCH_SIZES = (1, 2, 4, 8)


class MoEGraphs:
    def __init__(self, block: Callable[[int, torch.Tensor], torch.Tensor], device: torch.device,
                 host: HostCounters, batch_sizes: tuple[int, ...] = BATCH_SIZES, capture: bool | None = None):
        self.block, self.device, self.host = block, torch.device(device), host
        self.batch_sizes = tuple(batch_sizes)
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device; run eager")
        self.entries: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph | None, torch.Tensor, torch.Tensor]] = {}
        self.replays = 0
        self.stream: torch.cuda.Stream | None = None  # the capture stream, made at the first capture
        self.blocker: str | None = None  # why the model's blocks cannot be captured at all

    def reason(self, cache) -> str | None:
        """None when the engine's decode MoE blocks can be captured, else why they run eagerly."""
        if self.device.type != "cuda":
            return "CUDA graphs need CUDA"
        if self.blocker is not None:
            return self.blocker
        if cache.device_moe.cpu_lane:
            return f"split {cache.config.split.mode}: the CPU lane reads each layer's decision back"
        if cache.executor.plans is not None:
            return "keep_plans reads each decision back"
        return None

    def clear(self) -> None:
        self.entries.clear()

    def __call__(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """The MoE block of `layer` on h [T, D]: replayed when captured at T, else run eagerly."""
        T = h.shape[0]
        if T not in self.batch_sizes:
            return self.block(layer, h)
        entry = self.entries.get((layer, T))
        if entry is None:
            return self._first(layer, h)
        graph, h_in, out = entry
        h_in.copy_(h)
        if graph is None or counting():  # a launch count sees the block's kernels run eagerly
            return self.block(layer, h_in)
        graph.replay()
        self.host.launches += 1
        self.replays += 1
        return out

    def _first(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        h_in = torch.empty_like(h)  # [T, D] static input
        h_in.copy_(h)
        y = self.block(layer, h_in)  # the real step, eagerly (kernels compile here)
        graph, out = self._capture(layer, h_in) if self.capture else (None, y)
        self.entries[(layer, h.shape[0])] = (graph, h_in, out)
        return y

    def _capture(self, layer: int, h_in: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Record the block (nothing runs); the host counters it touched while recording are put back."""
        saved = self.host.to_dict()
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.device)  # one capture stream: one set of reserved buffers
        graph = torch.cuda.CUDAGraph()
        with capture(graph, self.stream):  # no per-capture sync / empty_cache / gc (graph_capture.py)
            out = self.block(layer, h_in)
        for name, value in saved.items():
            setattr(self.host, name, value)
        return graph, out


def decode_line(cache, graphs: MoEGraphs | None, eager: bool) -> str:
    """What `ft generate` says about how decode steps run."""
    if graphs is None:
        return "decode: eager (CUDA graphs hold the device placement only)"
    if eager:
        return "decode: eager (--eager)"
    reason = graphs.reason(cache)
    if reason is not None:
        return f"decode: eager ({reason})"
    sizes = ", ".join(map(str, graphs.batch_sizes))
    return f"decode: CUDA graphs of each layer's MoE block at batch sizes {sizes} (captured on first use)"
