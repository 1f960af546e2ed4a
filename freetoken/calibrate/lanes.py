"""The two miss lanes on a real expert geometry: the CPU lane computing experts from host memory, and PCIe copies
of experts into device slots; each alone and both at once (a hybrid step runs them together).

E = experts in the pool, D = hidden, I = expert intermediate size. Expert weights use the engine's slot layout:
w13 [E, 2I, D] (gate rows then up rows), w2 [E, D, I].
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from freetoken.calibrate.measure import Rate, sustain

FORMATS: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# CpuLane(expert indices in the pool) computes those experts on the host for the lane's tokens: one MoE layer call
CpuLane = Callable[[list[int]], object]


def torch_expert_ffn(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """SwiGLU expert: down(silu(gate x) * up x)."""
    gate, up = (x @ w13.T).chunk(2, dim=-1)  # [T, I] each
    return (F.silu(gate) * up) @ w2.T  # [T, D]


@dataclass(frozen=True, slots=True)
class Geometry:
    """One routed expert: hidden D, intermediate I, weight format. Default: Qwen3-30B-A3B."""

    hidden: int = 2048
    intermediate: int = 768
    fmt: str = "bf16"

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"expert format {self.fmt!r} is not one of {', '.join(FORMATS)}")
        if self.hidden <= 0 or self.intermediate <= 0:
            raise ValueError(f"expert geometry must be positive, got D={self.hidden}, I={self.intermediate}")

    @property
    def dtype(self) -> torch.dtype:
        return FORMATS[self.fmt]

    @property
    def expert_bytes(self) -> int:
        return 3 * self.hidden * self.intermediate * self.dtype.itemsize

    def pool_size(self, min_bytes: int) -> int:
        """Experts needed for the pool to span min_bytes (at least 4, so no expert is reused back to back)."""
        return max(4, -(-min_bytes // self.expert_bytes))


class ExpertPool:
    """E random experts in host memory (pinned when a GPU will copy them), visited round robin."""

    def __init__(self, geo: Geometry, experts: int, pin: bool = False):
        D, I = geo.hidden, geo.intermediate
        self.geo = geo
        self.w13 = torch.full((experts, 2 * I, D), 0.02, dtype=geo.dtype)  # [E, 2I, D]; values do not matter
        self.w2 = torch.full((experts, D, I), 0.02, dtype=geo.dtype)  # [E, D, I]
        if pin:
            self.w13, self.w2 = self.w13.pin_memory(), self.w2.pin_memory()
        self.experts = experts
        self._next = 0

    def take(self) -> int:
        e = self._next
        self._next = (e + 1) % self.experts
        return e


def torch_lane(pool: ExpertPool, tokens: int = 1) -> CpuLane:
    """The FFN as plain torch matmuls in the weights' own format, expert by expert."""
    x = torch.randn(tokens, pool.geo.hidden).to(pool.geo.dtype)
    return lambda experts: [torch_expert_ffn(x, pool.w13[e], pool.w2[e]) for e in experts]


def engine_lane(pool: ExpertPool, tokens: int = 1) -> CpuLane:
    """The live engine's own CPU lane (LiveExecutor's host path) over the pool as a one-layer expert store: one
    call per MoE layer call, every token routed to all the call's experts (one token: a decode step's layer)."""
    from freetoken.engine.executor import LiveExecutor
    from freetoken.engine.kernelset import kernel_set
    from freetoken.engine.slots import ExpertStore, SlotPool

    store = ExpertStore([(pool.w13, pool.w2)])
    executor = LiveExecutor(store, SlotPool(0, 1, store, "cpu"), kernel_set("reference"), torch.device("cpu"))
    x = torch.randn(tokens, pool.geo.hidden).to(pool.geo.dtype)

    def lane(experts: list[int]):
        ids = np.tile(np.asarray(experts, np.int64), (tokens, 1))  # [T, K]
        weights = torch.full(ids.shape, 1.0 / len(experts))  # [T, K] fp32
        return executor._cpu_lane(0, experts, x, weights, ids)

    return lane


def cpu_lane(pool: ExpertPool, seconds: float, lane: CpuLane, stop: threading.Event | None = None,
             per_call: int = 1) -> Rate:
    """Expert weight bytes the CPU lane gets through per second, `per_call` distinct experts per layer call."""
    if not 0 < per_call <= pool.experts:
        raise ValueError(f"experts per CPU-lane call must lie in [1, {pool.experts}], got {per_call}")
    return sustain(lambda: lane([pool.take() for _ in range(per_call)]), per_call * pool.geo.expert_bytes, seconds,
                   until=stop)


class DeviceSlots:
    """The engine's own slot pool on the GPU, filled from a one-layer expert store on a side stream, as the
    engine's fetch lane does (SlotPool.load per missing expert)."""

    def __init__(self, pool: ExpertPool, slots: int, device: str = "cuda"):
        from freetoken.engine.slots import ExpertStore, SlotPool

        self.store = ExpertStore([(pool.w13, pool.w2)])
        self.slot_pool = SlotPool(slots, 0, self.store, torch.device(device))
        self.slots = slots
        self.stream = torch.cuda.Stream(device=device)
        self._next = 0

    def gather(self, experts: list[int]) -> None:
        """Copies missing experts host -> slots on the side stream (no wait)."""
        with torch.cuda.stream(self.stream):
            for e in experts:
                s = self._next
                self._next = (s + 1) % self.slots
                self.slot_pool.load(s, self.store, 0, e)

    def sync(self) -> None:
        self.stream.synchronize()


def h2d_bulk(pool: ExpertPool, seconds: float) -> Rate:
    """One large pinned host -> device copy per pass: the PCIe ceiling."""
    dst = torch.empty_like(pool.w13, device="cuda")
    stream = torch.cuda.Stream()

    def one_pass():
        with torch.cuda.stream(stream):
            dst.copy_(pool.w13, non_blocking=True)

    return sustain(one_pass, pool.w13.numel() * pool.w13.element_size(), seconds, sync=stream.synchronize)


def gather_lane(pool: ExpertPool, slots: DeviceSlots, seconds: float, per_call: int = 4,
                stop: threading.Event | None = None) -> Rate:
    """Expert bytes per second the fetch lane moves, `per_call` missing experts per layer call."""

    def one_pass():
        slots.gather([pool.take() for _ in range(per_call)])

    return sustain(one_pass, per_call * pool.geo.expert_bytes, seconds, sync=slots.sync, until=stop)


def overlapped(cpu_pool: ExpertPool, lane: CpuLane, gpu_pool: ExpertPool, slots: DeviceSlots, seconds: float,
               per_call: int = 4) -> tuple[Rate, Rate]:
    """Both lanes at once, as in a hybrid step, `per_call` experts per call each; each rate is measured over the
    window where both ran."""
    out: dict[str, Rate] = {}
    done = threading.Event()

    def run_cpu():
        out["cpu"] = cpu_lane(cpu_pool, seconds, lane=lane, per_call=per_call)
        done.set()

    worker = threading.Thread(target=run_cpu, daemon=True)
    worker.start()
    out["dma"] = gather_lane(gpu_pool, slots, seconds, per_call, stop=done)
    worker.join()
    return out["cpu"], out["dma"]
