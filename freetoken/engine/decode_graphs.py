"""CUDA graphs of the decode step's MoE blocks: per MoE layer and batch size, router + top-k, the recorder's write,
the device placement, the expert gather and the expert FFNs, captured once and replayed (one launch per layer).

Attention stays eager (its kernels take the context length as an argument). A block is captured on its first use
at a fixed batch size, right after running it eagerly (which compiles its kernels and does that step's real work;
capture itself executes nothing). Its input is a static buffer the step copies h into; its output, the graph's own.
Graphs need CUDA and the device placement, and no host read inside a graph. A split with a CPU lane (hybrid, cpu)
runs its block as parts (LaneParts) around the host's one wait per layer: the front graph (router .. decision, and
the decision, x and the weights copied into pinned host buffers), then the lane on the host (it waits for those
copies and issues the CPU experts), the back graph (gather and FFNs up to their last launch, while the lane runs),
and the finish graph (the FFN's sum over pairs, with the lane's result uploaded from a pinned buffer folded in when
it had experts): 3 launches per layer instead of the eager block's ~15. Kept plans run eagerly. Without CUDA the
same static buffers are prepared and the block runs eagerly through them (`capture=False`), which is what the CPU
tests exercise.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from freetoken.engine.graph_capture import capture
from freetoken.engine.host_counters import HostCounters
from freetoken.engine.launch_count import counting

log = logging.getLogger("freetoken.engine")

BATCH_SIZES = (1, 2, 4, 8)  # (lane_staging.STATIC_ROWS keeps the pinned buffers of these)


@dataclass(frozen=True)
class LaneParts:
    """A block with a CPU lane, in the parts a graph can hold (device_moe.DeviceMoE's, the router in front)."""
    front: Callable[[int, torch.Tensor], Any]  # (layer, h) -> a Front: device work up to the staged decision
    lane: Callable[[int, Any], Future | None]  # (layer, front) -> the CPU lane issued (host: the layer's one wait)
    back: Callable[[int, Any], Any]  # (layer, front) -> a Back: gather and FFNs up to their last launch
    upload_buffer: Callable[[Future], torch.Tensor]  # the lane's joined result in its static (pinned) host buffer
    finish: Callable[[Any, torch.Tensor | None], torch.Tensor]  # (back, buffer or None) -> the block's output


@dataclass
class Segments:
    """One (layer, batch size)'s parts: their graphs (None: eager) and static tensors."""
    h_in: torch.Tensor
    front_graph: Any
    front: Any
    back_graph: Any
    back: Any
    copies: int  # host-counted copies inside the front and back graphs (a replay still makes them)
    # with / without the lane's term: (graph, buffer or None, out), each captured at its first need
    finish: dict[bool, tuple[Any, torch.Tensor | None, torch.Tensor]] = field(default_factory=dict)


class MoEGraphs:
    def __init__(self, block: Callable[[int, torch.Tensor], torch.Tensor], device: torch.device,
                 host: HostCounters, batch_sizes: tuple[int, ...] = BATCH_SIZES, capture: bool | None = None,
                 parts: LaneParts | None = None):
        """parts: the block's parts where the split has a CPU lane (None: one graph per block)."""
        self.block, self.device, self.host, self.parts = block, torch.device(device), host, parts
        self.batch_sizes = tuple(batch_sizes)
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device; run eager")
        self.entries: dict[tuple[int, int], Any] = {}  # (layer, T) -> (graph, h_in, out), or Segments with parts
        self.replays = 0
        self.stream: torch.cuda.Stream | None = None  # the capture stream, made at the first capture
        self.blocker: str | None = None  # why the model's blocks cannot be captured at all

    def reason(self, cache) -> str | None:
        """None when the engine's decode MoE blocks can be captured, else why they run eagerly."""
        if self.device.type != "cuda":
            return "CUDA graphs need CUDA"
        if self.blocker is not None:
            return self.blocker
        if cache.device_moe.cpu_lane and self.parts is None:
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
        if self.parts is not None:
            return self._in_parts(layer, h)
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
        captured = self._captured(lambda: self._capture(layer, h_in)) if self.capture else None
        graph, out = captured if captured is not None else (None, y)
        self.entries[(layer, h.shape[0])] = (graph, h_in, out)
        return y

    def _capture(self, layer: int, h_in: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        return self._capture_part(lambda: self.block(layer, h_in))[:2]

    def _captured(self, capture_it: Callable[[], tuple]) -> tuple | None:
        """capture_it()'s result, or None where the capture fails: the step already ran eagerly, so decode goes on
        eagerly (no more captures), with one warning that says why."""
        try:
            return capture_it()
        except Exception as e:  # an op that cannot be captured on this device / driver: eager stays right
            self.capture = False
            self.blocker = f"graph capture failed: {type(e).__name__}: {e}"
            log.warning("decode: CUDA graph capture failed (%s: %s); MoE blocks run eagerly", type(e).__name__, e)
            return None

    def _part_captured(self, part: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any, int] | None:
        return self._captured(lambda: self._capture_part(part))

    def _capture_part(self, part: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any, int]:
        """Record part() (nothing runs) -> (graph, its output, the copies it counted); the host counters it
        touched while recording are put back."""
        saved = self.host.to_dict()
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.device)  # one capture stream: one set of reserved buffers
        graph = torch.cuda.CUDAGraph()
        try:
            with capture(graph, self.stream):  # no per-capture sync / empty_cache / gc (graph_capture.py)
                out = part()
            copies = self.host.copies - saved["copies"]
        finally:
            for name, value in saved.items():
                setattr(self.host, name, value)
        return graph, out, copies

    def _in_parts(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """The block of a split with a CPU lane: front graph, the host's lane, back graph, finish graph."""
        p, seg = self.parts, self.entries.get((layer, h.shape[0]))
        if seg is None:
            return self._first_in_parts(layer, h)
        seg.h_in.copy_(h)
        if seg.front_graph is None or counting():  # eager through the static input (a launch count sees kernels)
            return self._eager_parts(layer, seg.h_in)
        seg.front_graph.replay()
        part = p.lane(layer, seg.front)
        seg.back_graph.replay()
        self.host.launches += 2
        self.host.copies += seg.copies
        self.replays += 1
        buf = None if part is None else p.upload_buffer(part)
        got = seg.finish.get(buf is not None)
        if (got is None or got[1] is not buf) and self.capture:
            captured = self._part_captured(lambda: p.finish(seg.back, buf))
            got = seg.finish[buf is not None] = None if captured is None else (captured[0], buf, captured[1])
        if got is None or got[1] is not buf:
            return p.finish(seg.back, buf)
        got[0].replay()
        self.host.launches += 1
        return got[2]

    def _eager_parts(self, layer: int, h_in: torch.Tensor) -> torch.Tensor:
        p = self.parts
        front = p.front(layer, h_in)
        part = p.lane(layer, front)
        back = p.back(layer, front)
        return p.finish(back, None if part is None else p.upload_buffer(part))

    def _first_in_parts(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        h_in = torch.empty_like(h)  # [T, D] static input
        h_in.copy_(h)
        y = self._eager_parts(layer, h_in)  # the real step, eagerly (kernels compile here)
        seg = Segments(h_in, None, None, None, None, 0)
        front = self._part_captured(lambda: self.parts.front(layer, h_in)) if self.capture else None
        back = self._part_captured(lambda: self.parts.back(layer, front[1])) if front is not None else None
        if back is not None:  # (both or neither: a front alone would leave the back eager on a stale decision)
            seg.front_graph, seg.front, seg.back_graph, seg.back = front[0], front[1], back[0], back[1]
            seg.copies = front[2] + back[2]
        self.entries[(layer, h.shape[0])] = seg
        return y


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
    if graphs.parts is not None:
        return (f"decode: CUDA graphs of each layer's MoE block in parts around the CPU lane (one host wait per layer) "
                f"at batch sizes {sizes} (captured on first use)")
    return f"decode: CUDA graphs of each layer's MoE block at batch sizes {sizes} (captured on first use)"
