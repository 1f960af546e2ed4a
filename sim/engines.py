"""Engines as configurations of the shared pieces: a residency policy, a miss split, and how copies overlap.

No engine has code of its own. llama.cpp's habit of copying CPU-held experts to the GPU for batches of
32 tokens or more is the split's fetch_min_pairs (32 x top_k pairs); its single stream is overlap=False.
Prefill fetches stream through staging buffers and leave the cache as decode left it (admit_prefill=False) in every
engine: FreeToken's double-buffered layer prefetch and llama.cpp's per-ubatch copies both land in scratch buffers
(docs/cost_model.md says why; pinned policies admit nothing either way).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from freetoken.defaults import check_prefill_chunk
from freetoken.placement import DEFAULT_PREFILL_CHUNK, Split
from freetoken.sim.cost import PREFILL_COPIES, CostOptions
from freetoken.sim.hardware import HardwareProfile
from freetoken.sim.model_card import ModelCard

# prefill_split: how an engine's prefill calls split their misses. same: as its decode does (this engine's hybrid:
# a CPU lane in prefill too); offload: every miss fetched to the GPU (FreeToken 0.1.2's hybrid: its CPU lane is
# decode's only), whatever the engine's split
PREFILL_SPLITS = ("same", "offload")
# prefill_copies (sim.cost.PREFILL_COPIES): missing is this engine's stream_prefill; layer is FreeToken 0.1.2's
# pipelined full-layer loading (engine/config.py moe_prefill_hit_d2d off: hits are copied from the host too)


@dataclass(frozen=True, slots=True)
class Engine:
    policy: str  # a name in freetoken.placement.POLICIES
    split: str  # offload | cpu | hybrid
    rule: str = "balanced"  # hybrid: balanced | paper
    policy_options: dict = field(default_factory=dict)  # n_cpu_layers: "all" | int | absent (from capacity)
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK  # tokens per prefill call (llama.cpp: its ubatch)
    overlap: bool = True
    # prefill: layer l+1's non-resident experts stream into a second staging set while layer l computes. freetoken's
    # needs two layers of staging rows (engine/executor.py stream_prefill); its default planner reserves one
    # (placement.memory.cache_rows), so off unless asked, which then plans two
    double_buffer: bool = False
    decode_overlap: bool = True  # False: decode's miss copies on the compute stream, before all expert GEMMs
    # > 0: decode's miss copies run at this rate (GB/s), an SM kernel reading pinned host memory instead of the copy
    # engine (whose rate is the hardware's BP, which still caps it); prefill's copies stay at BP. 0: at BP
    decode_gather_gb_s: float = 0.0
    prefill_split: str = "same"  # PREFILL_SPLITS: how prefill calls split their misses
    prefill_copies: str = "missing"  # PREFILL_COPIES: what a prefill call copies (its misses, or its whole layer)
    prefill_fetch_min_tokens: int = 0  # > 0: calls with this many tokens fetch their CPU-held experts
    admit_prefill: bool = False  # True: prefill fetches are offered cache slots like decode fetches
    expert_quant: str | None = None  # weight format the engine loads (QUANT_BITS), None = the card's
    dense_quant: str | None = None
    compute_dtype: str | None = None  # GEMM rate the engine's kernels run at, None = the card's
    resident: bool = False  # every expert in VRAM; an error when they do not fit
    staging: bool = False  # one layer of the planned slots is staging, not cache (freetoken's slot pool)
    host_work: str = "freetoken"  # whose launch / sync counts (sim.overhead.FLAVOURS)
    cuda_graphs: bool = False  # decode steps replayed as captured CUDA graphs
    dispatch_us: float = 0.0  # the engine's own host work per launch, beyond the driver's (hardware launch_us)
    cpu_threads: int = 0  # CPU-lane threads; 0 = every core of the hardware profile
    amx: bool = False  # CPU-lane GEMMs on AMX tiles (KTransformers' AMX backend): hardware cpu_amx_tflops
    kv_dtype: str = "auto"  # KV cache storage (freetoken.kv_dtype): fp8 halves its bytes, so more slots fit
    about: str = ""

    def __post_init__(self) -> None:
        from freetoken.sim.overhead import FLAVOURS

        if self.prefill_chunk <= 0:
            raise ValueError(f"engine prefill_chunk must be positive, got {self.prefill_chunk}")
        if self.host_work not in FLAVOURS:
            raise ValueError(f"engine host_work {self.host_work!r} is not one of {', '.join(FLAVOURS)}")
        if self.cpu_threads < 0 or self.dispatch_us < 0:
            raise ValueError("engine cpu_threads and dispatch_us must be >= 0")
        if not self.decode_gather_gb_s >= 0:
            raise ValueError(f"engine decode_gather_gb_s must be >= 0 (0: at the hardware's PCIe rate), got "
                             f"{self.decode_gather_gb_s}")
        if self.prefill_split not in PREFILL_SPLITS:
            raise ValueError(f"engine prefill_split {self.prefill_split!r} is not one of {', '.join(PREFILL_SPLITS)}")
        if self.double_buffer and not self.overlap:
            raise ValueError("engine double_buffer needs overlap (a copy stream beside compute)")
        if self.prefill_copies not in PREFILL_COPIES:
            raise ValueError(f"engine prefill_copies {self.prefill_copies!r} is not one of {', '.join(PREFILL_COPIES)}")
        if self.prefill_copies == "layer" and self.prefill_mode() != "offload":
            raise ValueError(f"engine prefill_copies layer: every expert of the layer is on the GPU, so prefill "
                             f"computes nothing on the CPU (prefill split {self.prefill_mode()}; prefill_split "
                             "offload gives it one)")
        if self.double_buffer and self.host_work == "freetoken" and (self.prefill_mode() != "offload"
                                                                      or self.admit_prefill):
            raise ValueError(f"engine double_buffer: freetoken streams the next layer in prefill only with the "
                             f"offload split and no prefill admission (this engine's prefill: split "
                             f"{self.prefill_mode()}; prefill_split offload gives it one)")
        from freetoken.kv_dtype import check_kv_dtype

        check_kv_dtype(self.kv_dtype, "kv_dtype")

    def settings(self) -> dict:
        """What a prediction assumed of this engine (anchor rows and `ft predict --json` state it)."""
        return {"prefill_chunk": self.prefill_chunk, "expert_format": self.expert_quant or "card",
                "dense_format": self.dense_quant or "card", "compute": self.compute_dtype or "card",
                "cuda_graphs": self.cuda_graphs, "cpu_threads": self.cpu_threads or "all", "amx": self.amx,
                "kv_dtype": self.kv_dtype, "decode_overlap": self.decode_overlap, "double_buffer": self.double_buffer,
                "prefill_split": self.prefill_split, "prefill_copies": self.prefill_copies,
                "decode_gather_gb_s": self.decode_gather_gb_s or "BP"}

    def split_for(self, card: ModelCard, hw: HardwareProfile) -> Split:
        hybrid = self.split == "hybrid"  # the other splits read no rule or bandwidths
        return Split(self.split, self.rule if hybrid else "balanced", hw.pcie_gb_s if hybrid else 0.0,
                     hw.host_gb_s if hybrid else 0.0, fetch_min_pairs=self.prefill_fetch_min_tokens * card.top_k, admit_prefill=self.admit_prefill)

    def prefill_mode(self) -> str:
        """The split mode prefill calls run with: the engine's own, or offload (prefill_split)."""
        return self.split if self.prefill_split == "same" else self.prefill_split

    def prefill_split_for(self) -> Split | None:
        """The Split prefill calls use where it is not the engine's own (sim.run.SimConfig.prefill_split); None
        where prefill splits its misses as decode does."""
        if self.prefill_mode() == self.split:
            return None
        return Split(self.prefill_mode(), admit_prefill=self.admit_prefill)

    def staging_layers(self) -> int:
        """Layers of experts the slot pool keeps as staging beside the cache (engines with staging): two with the
        double buffer (one set per layer in flight), else one."""
        return 2 if self.double_buffer else 1

    def cost_options(self, host: str) -> CostOptions:
        return CostOptions(host=host, overlap=self.overlap, double_buffer=self.double_buffer,
                           decode_overlap=self.decode_overlap, dispatch_us=self.dispatch_us,
                           decode_gather_gb_s=self.decode_gather_gb_s, prefill_copies=self.prefill_copies)

    def hardware_for(self, hw: HardwareProfile) -> HardwareProfile:
        """The CPU lane's FLOP rate under this engine's threads and AMX setting (BH stays: ft bench bw measures it
        with every thread, and a bandwidth-bound lane saturates DRAM before it runs out of cores)."""
        rate = hw.cpu_tflops
        if self.amx:
            if hw.cpu_amx_tflops <= 0:
                raise ValueError(f"hardware {hw.name}: no AMX (cpu_amx_tflops is 0), the engine asks for it")
            rate = hw.cpu_amx_tflops
        if self.cpu_threads:
            if not hw.cpu_cores:
                raise ValueError(f"hardware {hw.name}: cpu_cores is not given, so a thread count cannot apply")
            rate *= min(1.0, self.cpu_threads / hw.cpu_cores)
        return hw if rate == hw.cpu_tflops else replace(hw, cpu_tflops=rate)


# freetoken: Triton kernels launched from Python. vLLM PR #34838 (GB200): Triton's JIT dispatch 8.68 us per call,
# 4.51 us through a cached launcher; the difference is Python work per launch on top of the driver's issue time.
FREETOKEN_DISPATCH_US = 4.2
_LLAMACPP = dict(split="cpu", prefill_chunk=512, overlap=False, prefill_fetch_min_tokens=32,
                 expert_quant="q4_k_m", dense_quant="q4_k_m", host_work="llamacpp", cuda_graphs=True,
                 compute_dtype="int8")  # GGUF Q4_K_M; MMQ kernels: int8 dot products; CUDA graphs per split (#18934)

ENGINES: dict[str, Engine] = {
    "freetoken-offload": Engine("lru", "offload", staging=True, dispatch_us=FREETOKEN_DISPATCH_US,
                                about="global LRU expert cache, every miss fetched over PCIe"),
    "freetoken-hybrid": Engine("lru", "hybrid", rule="paper", staging=True, dispatch_us=FREETOKEN_DISPATCH_US,
                               about="global LRU, misses split q* = m BP / BH fetched, the rest on the CPU"),
    "llamacpp-cmoe": Engine("static_layers", policy_options={"n_cpu_layers": "all"}, **_LLAMACPP,
                            about="-cmoe: all routed experts on the CPU; batches >= 32 tokens copy them to the GPU"),
    "llamacpp-ncmoe": Engine("static_layers", **_LLAMACPP,
                             about="--n-cpu-moe N: the first N MoE layers on the CPU (N from VRAM unless given)"),
    "ktransformers": Engine("frequency", "cpu", host_work="graph", cuda_graphs=True,
                            about="most-used experts pinned on the GPU (profile = the trace), misses on the CPU"),
    "resident": Engine("static_layers", "offload", policy_options={"n_cpu_layers": 0}, resident=True,
                       host_work="graph", cuda_graphs=True,
                       about="every expert pinned in VRAM (vLLM-style)"),
}


# FreeToken 0.1.2's decode step (the release the published FreeToken anchors ran), counted from its code at tag v0.1.2
# (github.com/FlashML-org/FreeToken): the whole decode step is one captured CUDA graph (engine/graph.py GraphRunner,
# replayed per step), so a MoE layer launches nothing from the host and never syncs: the LRU decision is one device
# kernel (moe/offload_kernels.py ensure_experts -> flashlib lru_ensure, rewriting expert ids to slots in place),
# the misses move by one SM gather kernel reading pinned host memory (moe/offload_cache.py copy_missing ->
# kernel/fast_index_copy.py fast_index_copy_multi) on the compute stream, then one grouped GEMM over hits and
# fetched experts (layers/moe.py _decode_routed); hybrid layers hand the CPU lane its work through two stream memory
# operations on mapped flags, no host function (moe/cpu_executor.py, flag sync); the scheduler prepares the next
# step while the GPU runs (scheduler/scheduler.py overlap_loop). So: CUDA graphs on, and no copy beside the hits.
# The gather is SM loads of pinned host memory (kernel/csrc/jit/fast_index_copy.cuh fast_index_copy_multi, 8 blocks
# of 1024 threads per bank), not the copy engine: its authors measured it at ~31 GB/s, PCIe-bound (kernel/
# fast_index_copy.py, fast_index_copy_multi_jit's docstring; their GPU is an H100, sm_90, PCIe 5.0 x16: moe/
# offload_cache.py, benchmarks/bench_offload_cache_copy.py; the same code quotes ~55 GB/s for PCIe copies on a
# Sapphire Rapids host, kernel/csrc/cpu_moe/cpu_moe_ext.cpp). The review's "host RAM 63.6, PCIe 56.0 GB/s" on the
# anchor box read as ft bench bw's ceilings line (moe/benchbw.py _print_report: CPU STREAM read, PCIe linear H2D,
# measure_pcie_bw: the copy engine), not its per-format PCIe-gather column; the copy engine is what 0.1.2's prefill
# uses (offload_cache.py prefetch_prefill_layer: whole-layer copy_ on a copy stream), its decode does not. The gather
# rate is not measured on the anchor box's GPU (an RTX 5090, also PCIe 5.0 x16).
FREETOKEN_012_GATHER_GB_S = 31.0
FREETOKEN_012_DECODE = {"cuda_graphs": True, "decode_overlap": False, "decode_gather_gb_s": FREETOKEN_012_GATHER_GB_S}
# FreeToken 0.1.2's offload prefill, at the same tag: double-buffered by default (engine/config.py
# moe_prefill_overlap=True): layer l+1 streams into the second of two expert-layer buffers behind layer l's GEMMs
# (layers/moe.py _wait_prefill_overlap), the two buffers borrowed from the slot cache when it holds >= 2 x num_experts
# (engine/cache_budget.py). It copies whole layers, resident experts too (moe_prefill_hit_d2d off: prefill_copies
# layer), where this engine streams the non-resident experts only.
# Its defaults: 8192-token prefill chunks (scheduler/config.py max_extend_tokens) and full-layer copies. The paper's
# own prefill analysis (Qwen3.6-35B-A3B bf16, RTX 5090 at 52.7 GB/s: an 8192-token chunk in ~1.19-1.22 s with
# pipelined full-layer loading, ~6,700 tok/s at 16,000 tokens) is sim/paper_checks.py's check of this setting.
FREETOKEN_012_PREFILL_CHUNK = 8192
FREETOKEN_012_OFFLOAD_PREFILL = {"double_buffer": True, "prefill_copies": "layer",
                                 "prefill_chunk": FREETOKEN_012_PREFILL_CHUNK}

# FreeToken 0.1.2's hybrid prefill, at the same tag: its hybrid mode (--moe-backend hybrid) changes decode only.
# OffloadMoELayer._prefill_routed (layers/moe.py) reads no decode_target: a hybrid layer's prefill streams whole layers
# into the same double buffer as offload (_wait_prefill_overlap) and runs the same _expert_gemm kernels on the GPU,
# no CPU work; only _decode_routed branches to _decode_hybrid, where misses beyond the fetch cap go to the CPU. The
# engine builds the hybrid cache with the same prefill_overlap (engine/engine.py _init_offload_moe_cache:
# OffloadMoeCache(prefill_overlap=config.moe_prefill_overlap), default True), and with the default NVFP4 backend
# (--nvfp4-backend triton) offload's banks are the native "nvfp4" layout the hybrid's are (moe/expert_banks.py
# _nvfp4_banks). So: every prefill miss fetched, double-buffered, as the offload row's prefill.
FREETOKEN_012_HYBRID_PREFILL = {"prefill_split": "offload", **FREETOKEN_012_OFFLOAD_PREFILL}

# GGUF types llama.cpp can load experts as: bits per weight (sim.model_card.QUANT_BITS) and the GEMM rate they run at
GGUF_TYPES = {"q2_k": "int8", "q3_k_m": "int8", "q4_0": "int8", "iq4_xs": "int8", "q4_k_m": "int8", "q5_k_m": "int8",
              "q6_k": "int8", "q8_0": "int8", "bf16": "bf16"}


def with_settings(engine: Engine, *, prefill_chunk: int | None = None, gguf_type: str | None = None,
                  expert_format: str | None = None, cuda_graphs: bool | None = None, cpu_threads: int | None = None,
                  amx: bool | None = None, kv_dtype: str | None = None,
                  decode_overlap: bool | None = None, double_buffer: bool | None = None,
                  prefill_split: str | None = None, decode_gather_gb_s: float | None = None,
                  prefill_copies: str | None = None) -> Engine:
    """An engine with the settings a run used. gguf_type: llama.cpp's file type (experts and dense weights, and
    the GEMM path: MMQ int8 for quantized types, cuBLAS bf16 for bf16); prefill_chunk is llama.cpp's ubatch."""
    new: dict = {}
    if prefill_chunk is not None:
        check_prefill_chunk(prefill_chunk, "prefill chunk / ubatch")
        new["prefill_chunk"] = prefill_chunk
    if gguf_type is not None:
        if engine.host_work != "llamacpp":
            raise ValueError("a GGUF type applies to llama.cpp engines (llamacpp-*)")
        if gguf_type not in GGUF_TYPES:
            raise ValueError(f"unknown GGUF type {gguf_type!r}; valid: {', '.join(GGUF_TYPES)}")
        new.update(expert_quant=gguf_type, dense_quant=gguf_type, compute_dtype=GGUF_TYPES[gguf_type])
    if expert_format is not None:
        new["expert_quant"] = expert_format
    if cuda_graphs is not None:
        new["cuda_graphs"] = cuda_graphs
    if cpu_threads is not None:
        if cpu_threads <= 0:
            raise ValueError(f"cpu threads must be positive, got {cpu_threads}")
        new["cpu_threads"] = cpu_threads
    if amx is not None:
        new["amx"] = amx
    if kv_dtype is not None:
        new["kv_dtype"] = kv_dtype  # checked by Engine
    if decode_overlap is not None:
        new["decode_overlap"] = decode_overlap
    if double_buffer is not None:
        new["double_buffer"] = double_buffer  # checked by Engine
    if prefill_split is not None:
        new["prefill_split"] = prefill_split  # checked by Engine
    if decode_gather_gb_s is not None:
        new["decode_gather_gb_s"] = float(decode_gather_gb_s)  # checked by Engine
    if prefill_copies is not None:
        new["prefill_copies"] = prefill_copies  # checked by Engine
    return replace(engine, **new)


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; valid: {', '.join(ENGINES)}") from None
