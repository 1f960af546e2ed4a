"""One `ft bench bw` run: host read, CPU lane, and (with CUDA) PCIe alone and overlapped, then a recommendation.

Every lane is read `repeats` times (freetoken/calibrate/repeat.py): its profile entry holds the readings, their
median (`gb_s`, what `--split auto` and the cost model take) and spread, and any reading retried as far below the
rest. The CPU lane is the engine's own host path, one call per MoE layer call with `misses_per_call` experts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

import freetoken
from freetoken.calibrate.lanes import (DeviceSlots, ExpertPool, Geometry, cpu_lane, engine_lane, gather_lane,
                                       h2d_bulk, overlapped, torch_lane)
from freetoken.calibrate.measure import host_read, last_level_cache_bytes, significant
from freetoken.calibrate.mode import recommend
from freetoken.calibrate.profile import PROFILE_VERSION, profile_key
from freetoken.calibrate.repeat import measure_repeated, repeat_rate

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class BenchConfig:
    geometry: Geometry = field(default_factory=Geometry)
    seconds: float = 1.0  # per reading
    repeats: int = 3  # readings per lane (median kept)
    min_buffer_bytes: int = 512 * MiB  # every buffer and expert pool spans at least this
    llc_multiple: int = 4  # ... and this many times the last-level cache
    misses_per_call: int = 4  # missing experts per decode layer call, for the predicted split
    probe: bool = True  # end-to-end decode probe, offload vs hybrid (needs CUDA and the engine)

    def __post_init__(self) -> None:
        if self.seconds <= 0:
            raise ValueError(f"seconds must be positive, got {self.seconds}")
        if self.misses_per_call <= 0:
            raise ValueError(f"misses per call must be positive, got {self.misses_per_call}")
        if self.repeats <= 0:
            raise ValueError(f"repeats must be positive, got {self.repeats}")

    @classmethod
    def quick(cls, geometry: Geometry) -> "BenchConfig":
        """A few seconds in all: buffers just past the cache, short readings, no probe."""
        return cls(geometry, seconds=0.25, min_buffer_bytes=256 * MiB, probe=False)


def run_bench(cfg: BenchConfig, log: Callable[[str], None] = lambda s: None) -> dict:
    from freetoken.host import kernels as host_kernels

    geo, n, m = cfg.geometry, cfg.repeats, cfg.misses_per_call
    llc = last_level_cache_bytes()
    span = max(cfg.min_buffer_bytes, cfg.llc_multiple * llc)
    cuda = torch.cuda.is_available()
    gpu = torch.cuda.get_device_name() if cuda else None
    profile = {
        "version": PROFILE_VERSION, "key": profile_key(gpu, geo.fmt), "gpu": gpu, "expert_format": geo.fmt,
        "geometry": {"hidden": geo.hidden, "intermediate": geo.intermediate, "expert_bytes": geo.expert_bytes},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "freetoken": freetoken.__version__,
        "threads": torch.get_num_threads(), "host_kernel_threads": host_kernels.threads(), "llc_bytes": llc,
        "seconds_per_measurement": cfg.seconds, "repeats": n,
    }

    def retry(line: str) -> None:
        log(f"  {line}")

    log(f"host read: {span / MiB:.0f} MiB buffer, {n} x {cfg.seconds:g} s")
    profile["host"] = {**repeat_rate(lambda: host_read(span, cfg.seconds), n, log=retry).to_dict(),
                       "buffer_bytes": span}
    cpu_pool = ExpertPool(geo, geo.pool_size(span))
    lane, lane_name = cpu_lane_function(cpu_pool)
    log(f"CPU lane ({lane_name}): {cpu_pool.experts} experts of {geo.expert_bytes / MiB:.1f} MiB, {m} per layer "
        f"call, 1 token, {n} x {cfg.seconds:g} s")
    profile["cpu_lane"] = {**repeat_rate(lambda: cpu_lane(cpu_pool, cfg.seconds, lane, per_call=m), n,
                                         log=retry).to_dict(),
                           "function": lane_name, "experts_in_pool": cpu_pool.experts, "tokens_per_expert": 1,
                           "experts_per_call": m}
    profile["pcie"] = profile["overlap"] = profile["decode_probe"] = profile["gpu_probe"] = None
    dma = cpu_ov = dma_ov = None
    if cuda:
        gpu_pool = ExpertPool(geo, geo.pool_size(span), pin=True)
        slots = DeviceSlots(gpu_pool, slots=max(8, m * 2))
        log(f"PCIe: pinned bulk copy and expert gather, {m} experts per call")
        bulk = repeat_rate(lambda: h2d_bulk(gpu_pool, cfg.seconds), n, log=retry)
        gather = repeat_rate(lambda: gather_lane(gpu_pool, slots, cfg.seconds, m), n, log=retry)
        profile["pcie"] = {"h2d_bulk": bulk.to_dict(), "gather": gather.to_dict(),
                           "gb_s": significant(gather.median_gb_s)}
        log("CPU lane and expert gather at the same time")

        def both():
            cpu_r, dma_r = overlapped(cpu_pool, lane, gpu_pool, slots, cfg.seconds, m)
            return {"cpu_lane": cpu_r, "gather": dma_r}

        ov = measure_repeated(both, n, log=retry)
        profile["overlap"] = {name: r.to_dict() for name, r in ov.items()}
        dma, cpu_ov, dma_ov = gather.median_gb_s, ov["cpu_lane"].median_gb_s, ov["gather"].median_gb_s
        from freetoken.calibrate.gpu_probe import gpu_probe

        log("GPU probe: launch, sync, kernel floor, GEMM and GEMV rates")
        profile["gpu_probe"] = gpu_probe()
        if cfg.probe:
            from freetoken.calibrate.probe import ProbeModel, decode_probe

            log("decode probe: the engine decoding with offload, then hybrid")
            profile["decode_probe"] = decode_probe(dma_ov, cpu_ov, ProbeModel(geometry=geo))
    profile["recommendation"] = recommend(dma, cpu_ov, dma_ov, m, profile["decode_probe"])
    return profile


def cpu_lane_function(pool: ExpertPool):
    """The engine's own CPU lane; the torch expression of the same FFN only where the engine cannot be imported."""
    try:
        return engine_lane(pool), "engine (LiveExecutor host lane)"
    except ImportError:
        return torch_lane(pool), "torch reference (engine not importable)"
