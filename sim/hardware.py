"""Hardware profiles: the bandwidths, rates and capacities the cost model charges against.

A profile is a plain YAML mapping in conf/hardware/<name>.yaml (also a Hydra config group) of HardwareProfile's
fields plus `sources`: field -> where the number comes from (datasheet, published measurement, `ft bench bw`).
Every number must carry a source; a profile without one is rejected. Bandwidths in GB/s (1e9 B/s), rates in TFLOP/s.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

from freetoken.paths import CONF_DIR
from freetoken.sim.config_file import build, read_mapping, require_positive, resolve

HARDWARE_DIR = CONF_DIR / "hardware"
GIB = 1 << 30
CHARGE_FREE = ("launch_us", "sync_us", "kernel_floor_us", "gemm_efficiency", "gemv_efficiency", "moe_gemm_efficiency",
               "attention_efficiency", "cpu_cores", "cpu_amx_tflops")  # at their defaults: no source needed


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    name: str
    gpu: str
    cpu: str
    vram_gib: float  # per GPU
    hbm_gb_s: float  # GPU memory bandwidth
    gpu_bf16_tflops: float  # dense tensor rate, fp32 accumulate (the rate W4A16 GEMMs run at after dequant)
    gpu_fp8_tflops: float  # 0 = no fp8 tensor cores (bf16 rate is used)
    gpu_int4_tflops: float  # int4/fp4 tensor rate, 0 = none
    gpu_int8_tflops: float  # int8 dot-product rate (tensor cores, or dp4a on Pascal): llama.cpp's quantized GEMMs
    pcie_gb_s: float  # BP: pinned host -> GPU copy bandwidth
    host_gb_s: float  # BH: host-side expert processing (CPU reading expert weights)
    dram_gb_s: float  # host DRAM bandwidth both the DMA engine and the CPU draw from (contention model)
    cpu_tflops: float  # CPU expert-GEMM throughput (int8/bf16 SIMD, all cores)
    cpu_lane_latency_us: float  # fixed cost of one CPU-lane call: activations to host, thread wake-up, back
    pcie_call_latency_us: float  # fixed cost of one fetching call: routing ids to the host, first copy enqueued
    gpu_reserved_gib: float  # CUDA context, activations and workspace: not available for weights or KV
    sources: dict[str, str]
    num_gpus: int = 1  # layers split across GPUs (pipeline): VRAM adds up, one token sees one GPU at a time
    notes: str = ""
    # per-layer fixed costs (sim/overhead.py) and achieved rates; the defaults charge nothing and need no source
    launch_us: float = 0.0  # host issue time of one kernel launch (driver + launcher), back to back
    sync_us: float = 0.0  # a host sync: the stream drains, then a small device-to-host copy returns
    kernel_floor_us: float = 0.0  # GPU time of a kernel beyond its bytes / FLOPs (start, ramp-up, tail)
    gemm_efficiency: float = 1.0  # achieved / datasheet tensor rate of a large GEMM (compute-bound prefill)
    gemv_efficiency: float = 1.0  # achieved / datasheet memory bandwidth of a weight-streaming kernel (decode)
    moe_gemm_efficiency: float = 0.0  # achieved / datasheet rate of the experts' grouped low-bit GEMMs (0: gemm's)
    attention_efficiency: float = 0.0  # achieved / datasheet rate of flash-attention prefill (0: gemm's)
    cpu_cores: int = 0  # cores cpu_tflops is quoted for (0 = not given: a thread count cannot be applied)
    cpu_amx_tflops: float = 0.0  # CPU expert-GEMM rate on AMX tiles (0 = no AMX)

    def __post_init__(self) -> None:
        require_positive(self, ("vram_gib", "hbm_gb_s", "gpu_bf16_tflops", "pcie_gb_s", "host_gb_s", "dram_gb_s",
                                "cpu_tflops", "num_gpus"))
        require_positive(self, ("gpu_fp8_tflops", "gpu_int4_tflops", "gpu_int8_tflops", "cpu_lane_latency_us",
                                "pcie_call_latency_us", "gpu_reserved_gib"),
                         allow_zero=True)
        require_positive(self, ("launch_us", "sync_us", "kernel_floor_us", "cpu_cores", "cpu_amx_tflops"), allow_zero=True)
        for name in ("gemm_efficiency", "gemv_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"field '{name}' must lie in (0, 1], got {getattr(self, name)}")
        for name in ("moe_gemm_efficiency", "attention_efficiency"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"field '{name}' must lie in [0, 1] (0: as gemm_efficiency), got "
                                 f"{getattr(self, name)}")
        numeric = [f.name for f in fields(self) if f.type in ("float", "int") and f.name != "num_gpus"
                   and not (f.name in CHARGE_FREE and getattr(self, f.name) == f.default)]
        missing = [n for n in numeric if n not in self.sources]
        if missing:
            raise ValueError(f"field 'sources' gives no source for {', '.join(missing)}")
        unknown = set(self.sources) - {f.name for f in fields(self)}
        if unknown:
            raise ValueError(f"field 'sources' names unknown field(s) {', '.join(sorted(unknown))}")

    @property
    def vram_bytes(self) -> float:
        return self.num_gpus * self.vram_gib * GIB

    @property
    def reserved_bytes(self) -> float:
        return self.num_gpus * self.gpu_reserved_gib * GIB

    def gpu_tflops(self, dtype: str) -> float:
        """Tensor rate for a GEMM dtype, falling back to bf16 where the GPU lacks that path."""
        rate = {"bf16": self.gpu_bf16_tflops, "fp8": self.gpu_fp8_tflops, "int4": self.gpu_int4_tflops,
                "int8": self.gpu_int8_tflops}[dtype]
        return rate if rate > 0 else self.gpu_bf16_tflops

    def to_dict(self) -> dict:
        return asdict(self)

    def achieved_tflops(self, dtype: str) -> float:
        """The tensor rate a large GEMM reaches: the datasheet rate x gemm_efficiency."""
        return self.gpu_tflops(dtype) * self.gemm_efficiency

    def moe_tflops(self, dtype: str) -> float:
        """The tensor rate the experts' grouped GEMMs reach: tens of tokens per expert, low-bit weights dequantized
        in the kernel: the datasheet rate x moe_gemm_efficiency (compute-bound expert lanes in prefill); a profile
        that does not give it charges them as a large GEMM (gemm_efficiency)."""
        return self.gpu_tflops(dtype) * (self.moe_gemm_efficiency or self.gemm_efficiency)

    def attention_tflops(self, dtype: str) -> float:
        """The rate attention's FLOPs (QK^T and PV over the context) reach in a flash-attention kernel: the datasheet
        rate x attention_efficiency; a profile that does not give it charges them as a large GEMM."""
        return self.gpu_tflops(dtype) * (self.attention_efficiency or self.gemm_efficiency)

    @property
    def achieved_hbm_gb_s(self) -> float:
        return self.hbm_gb_s * self.gemv_efficiency


def load_hardware(name_or_path: str) -> HardwareProfile:
    path = resolve(name_or_path, HARDWARE_DIR, "hardware")
    return build(HardwareProfile, read_mapping(path), str(path))


def hardware_names() -> list[str]:
    return sorted(p.stem for p in Path(HARDWARE_DIR).glob("*.yaml"))


def with_bench_profile(hw: HardwareProfile, profile: dict, where: str) -> HardwareProfile:
    """The profile's PCIe, CPU-lane and host-DRAM numbers replaced by what `ft bench bw` measured on the machine.

    BP: the expert-gather copy rate; BH: the CPU lane; DRAM: what the two lanes moved together when run at once
    (their sum is the shared ceiling when they contend, and >= BP + BH, i.e. no contention, when they do not).
    Each `gb_s` is the median of the lane's readings (freetoken/calibrate/repeat.py).
    """
    from dataclasses import replace

    sources = dict(hw.sources)
    new = {"host_gb_s": float(profile["cpu_lane"]["gb_s"])}
    sources["host_gb_s"] = f"ft bench bw ({where}): cpu_lane.gb_s (median of its readings)"
    if profile.get("pcie"):
        new["pcie_gb_s"] = float(profile["pcie"]["gb_s"])
        sources["pcie_gb_s"] = f"ft bench bw ({where}): pcie.gb_s (expert gather)"
    if profile.get("overlap"):
        new["dram_gb_s"] = float(profile["overlap"]["cpu_lane"]["gb_s"]) + float(profile["overlap"]["gather"]["gb_s"])
        sources["dram_gb_s"] = f"ft bench bw ({where}): overlap.cpu_lane.gb_s + overlap.gather.gb_s"
    else:
        new["dram_gb_s"] = float(profile["host"]["gb_s"])
        sources["dram_gb_s"] = f"ft bench bw ({where}): host.gb_s (sustained read)"
    gpu = profile.get("gpu_probe")
    if gpu:  # measured on this GPU by ft bench bw's launch / sync / GEMM / GEMV probe
        new["launch_us"], new["sync_us"] = float(gpu["launch_us"]), float(gpu["sync_us"])
        new["kernel_floor_us"] = float(gpu["kernel_floor_us"])
        new["gemm_efficiency"] = min(1.0, float(gpu["gemm_tflops"]) / hw.gpu_bf16_tflops)
        new["gemv_efficiency"] = min(1.0, float(gpu["gemv_gb_s"]) / hw.hbm_gb_s)
        for name, key in (("launch_us", "launch_us"), ("sync_us", "sync_us"), ("kernel_floor_us", "kernel_floor_us"),
                          ("gemm_efficiency", "gemm_tflops"),
                          ("gemv_efficiency", "gemv_gb_s")):
            sources[name] = f"ft bench bw ({where}): gpu_probe.{key}"
    try:
        return replace(hw, **new, sources=sources)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
