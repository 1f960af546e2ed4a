"""Engines as configurations of the shared pieces: a residency policy, a miss split, and how copies overlap.

No engine has code of its own. llama.cpp's habit of copying CPU-held experts to the GPU for batches of
32 tokens or more is the split's fetch_min_pairs (32 x top_k pairs); its single stream is overlap=False.
Prefill fetches stream through staging buffers and leave the cache as decode left it (admit_prefill=False) in every
engine: FreeToken's double-buffered layer prefetch and llama.cpp's per-ubatch copies both land in scratch buffers
(docs/cost_model.md says why; pinned policies admit nothing either way).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from freetoken.placement import Split
from freetoken.sim.cost import CostOptions
from freetoken.sim.hardware import HardwareProfile
from freetoken.sim.model_card import ModelCard


@dataclass(frozen=True, slots=True)
class Engine:
    policy: str  # a name in freetoken.placement.POLICIES
    split: str  # offload | cpu | hybrid
    rule: str = "balanced"  # hybrid: balanced | paper
    policy_options: dict = field(default_factory=dict)  # n_cpu_layers: "all" | int | absent (from capacity)
    prefill_chunk: int = 2048  # tokens per prefill call (llama.cpp: its ubatch)
    overlap: bool = True
    double_buffer: bool = True
    prefill_fetch_min_tokens: int = 0  # > 0: calls with this many tokens fetch their CPU-held experts
    admit_prefill: bool = False  # True: prefill fetches are offered cache slots like decode fetches
    expert_quant: str | None = None  # weight format the engine loads (QUANT_BITS), None = the card's
    dense_quant: str | None = None
    compute_dtype: str | None = None  # GEMM rate the engine's kernels run at, None = the card's
    resident: bool = False  # every expert in VRAM; an error when they do not fit
    staging: bool = False  # one layer of the planned slots is staging, not cache (freetoken's slot pool)
    about: str = ""

    def split_for(self, card: ModelCard, hw: HardwareProfile) -> Split:
        return Split(self.split, self.rule, hw.pcie_gb_s, hw.host_gb_s,
                     fetch_min_pairs=self.prefill_fetch_min_tokens * card.top_k, admit_prefill=self.admit_prefill)

    def cost_options(self, host: str) -> CostOptions:
        return CostOptions(host=host, overlap=self.overlap, double_buffer=self.double_buffer)


_LLAMACPP = dict(split="cpu", prefill_chunk=512, overlap=False, double_buffer=False, prefill_fetch_min_tokens=32,
                 expert_quant="q4_k_m", dense_quant="q4_k_m",
                 compute_dtype="int8")  # GGUF Q4_K_M; MMQ kernels: int8 dot products

ENGINES: dict[str, Engine] = {
    "freetoken-offload": Engine("lru", "offload", staging=True,
                                about="global LRU expert cache, every miss fetched over PCIe"),
    "freetoken-hybrid": Engine("lru", "hybrid", rule="paper", staging=True,
                               about="global LRU, misses split q* = m BP / BH fetched, the rest on the CPU"),
    "llamacpp-cmoe": Engine("static_layers", policy_options={"n_cpu_layers": "all"}, **_LLAMACPP,
                            about="-cmoe: all routed experts on the CPU; batches >= 32 tokens copy them to the GPU"),
    "llamacpp-ncmoe": Engine("static_layers", **_LLAMACPP,
                             about="--n-cpu-moe N: the first N MoE layers on the CPU (N from VRAM unless given)"),
    "ktransformers": Engine("frequency", "cpu", double_buffer=False,
                            about="most-used experts pinned on the GPU (profile = the trace), misses on the CPU"),
    "resident": Engine("static_layers", "offload", policy_options={"n_cpu_layers": 0}, resident=True,
                       about="every expert pinned in VRAM (vLLM-style)"),
}


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; valid: {', '.join(ENGINES)}") from None
