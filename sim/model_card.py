"""Model cards: the shape and weight sizes of an MoE model, the physical inputs of the cost model.

A card is a plain YAML mapping in conf/model/<name>.yaml (also a Hydra config group) of ModelCard's fields,
plus `source` (where the numbers come from) and `estimated` (field -> why it is an estimate).
Parameter counts are in billions. Expert params are derived: matrices x hidden x intermediate (gate, up, down).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from freetoken.paths import CONF_DIR
from sim.config_file import build, read_mapping, require_positive, resolve

MODEL_DIR = CONF_DIR / "model"

# Bits per weight including scales, by storage format; engines name one to override a card's default.
QUANT_BITS: dict[str, float] = {
    "bf16": 16.0,
    "fp8": 8.0,  # e4m3 + one fp32 scale per 128x128 block (DeepSeek-V3): +0.002
    "int4": 4.25,  # 4-bit + one fp16 scale per 64 weights (GPTQ/AWQ/AutoRound-style groups)
    "mxfp4": 4.25,  # 4-bit + one e8m0 scale per 32 (OCP MX spec; gpt-oss experts)
    "nvfp4": 4.5,  # 4-bit + one fp8 scale per 16 (NVIDIA NVFP4)
    "q4_k_m": 4.85,  # llama.cpp Q4_K_M mix (Q4_K 4.5 bpw, Q6_K 6.56 bpw for part of ffn_down); llama.cpp quantize table
}

COMPUTE_DTYPES = ("bf16", "fp8", "int4", "int8")

# Published totals and the fields must agree this well (active counts differ on whether embeddings count).
TOTAL_TOLERANCE = 0.05
ACTIVE_TOLERANCE = 0.35


@dataclass(frozen=True, slots=True)
class ModelCard:
    name: str
    hf_id: str
    num_layers: int  # transformer blocks
    moe_layers: int  # blocks with routed experts
    num_experts: int  # routed experts per MoE layer
    top_k: int
    shared_experts: int  # always-on experts per MoE layer (their weights count in dense_params)
    hidden_size: int
    expert_intermediate_size: int
    dense_params: float  # B; every non-routed weight read per token: attention, dense MLPs, shared experts, lm_head
    embedding_params: float  # B; input embedding table: resident, one row read per token
    kv_bytes_per_token: int  # KV cache bytes per context token, all layers, at 16 bit
    attention_layers: int  # layers whose KV cache grows with the context (full attention)
    attention_width: int  # query heads x head dim: 4 * width FLOPs per (token, context token) per layer
    expert_bits: float  # bits per routed-expert weight incl. scales, of the checkpoint this card describes
    dense_bits: float
    total_params: float  # B, published
    active_params: float  # B, published
    source: str
    expert_matrices: int = 3
    compute_dtype: str = "bf16"  # GPU tensor rate the expert and dense GEMMs run at (hardware gpu_<dtype>_tflops)
    estimated: dict[str, str] = field(default_factory=dict)
    notes: str = ""

    def __post_init__(self) -> None:
        require_positive(self, ("num_layers", "moe_layers", "num_experts", "top_k", "hidden_size",
                                "expert_intermediate_size", "dense_params", "kv_bytes_per_token",
                                "attention_width", "expert_bits", "dense_bits", "total_params", "active_params",
                                "expert_matrices"))
        require_positive(self, ("shared_experts", "embedding_params", "attention_layers"), allow_zero=True)
        if self.top_k > self.num_experts:
            raise ValueError(f"field 'top_k' ({self.top_k}) exceeds field 'num_experts' ({self.num_experts})")
        if self.moe_layers > self.num_layers:
            raise ValueError(f"field 'moe_layers' ({self.moe_layers}) exceeds field 'num_layers' ({self.num_layers})")
        if self.attention_layers > self.num_layers:
            raise ValueError(f"field 'attention_layers' ({self.attention_layers}) exceeds 'num_layers' "
                             f"({self.num_layers})")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"field 'compute_dtype' {self.compute_dtype!r} is not one of {', '.join(COMPUTE_DTYPES)}")
        unknown = set(self.estimated) - set(ModelCard.__dataclass_fields__)
        if unknown:
            raise ValueError(f"field 'estimated' names unknown field(s) {', '.join(sorted(unknown))}")
        for name, published, derived, tol in (("total_params", self.total_params, self.derived_total_params,
                                               TOTAL_TOLERANCE),
                                              ("active_params", self.active_params, self.derived_active_params,
                                               ACTIVE_TOLERANCE)):
            if abs(derived - published) > tol * published:
                raise ValueError(f"field '{name}' ({published} B) disagrees with the shape fields, which give "
                                 f"{derived:.2f} B (tolerance {tol:.0%})")

    # derived sizes
    @property
    def expert_params(self) -> int:
        return self.expert_matrices * self.hidden_size * self.expert_intermediate_size

    @property
    def num_keys(self) -> int:
        return self.moe_layers * self.num_experts

    @property
    def derived_total_params(self) -> float:
        return self.dense_params + self.embedding_params + self.num_keys * self.expert_params / 1e9

    @property
    def derived_active_params(self) -> float:
        return self.dense_params + self.embedding_params + self.moe_layers * self.top_k * self.expert_params / 1e9

    def with_quant(self, expert: str | None = None, dense: str | None = None,
                   compute: str | None = None) -> "ModelCard":
        """The same model stored in other formats (names in QUANT_BITS), its GEMMs at another rate."""
        from dataclasses import replace

        for fmt in (expert, dense):
            if fmt is not None and fmt not in QUANT_BITS:
                raise ValueError(f"unknown quantization {fmt!r}; valid: {', '.join(QUANT_BITS)}")
        return replace(self, expert_bits=QUANT_BITS[expert] if expert else self.expert_bits,
                       dense_bits=QUANT_BITS[dense] if dense else self.dense_bits,
                       compute_dtype=compute or self.compute_dtype)

    def expert_bytes(self) -> int:
        return int(round(self.expert_params * self.expert_bits / 8))

    def dense_bytes(self) -> int:
        """Weights read every token (excludes the embedding table)."""
        return int(round(self.dense_params * 1e9 * self.dense_bits / 8))

    def embedding_bytes(self) -> int:
        return int(round(self.embedding_params * 1e9 * self.dense_bits / 8))

    def all_expert_bytes(self) -> int:
        return self.num_keys * self.expert_bytes()

    def to_dict(self) -> dict:
        return asdict(self)


def load_model_card(name_or_path: str) -> ModelCard:
    path = resolve(name_or_path, MODEL_DIR, "model")
    return build(ModelCard, read_mapping(path), str(path))


def model_names() -> list[str]:
    return sorted(p.stem for p in Path(MODEL_DIR).glob("*.yaml"))
