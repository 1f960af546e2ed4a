"""Model cards: the shape and weight sizes of an MoE model, the physical inputs of the cost model.

A card is a plain YAML mapping in conf/model/<name>.yaml (also a Hydra config group) of ModelCard's fields,
plus `source` (where the numbers come from) and `estimated` (field -> why it is an estimate).
Parameter counts are in billions. Expert params are derived: matrices x hidden x intermediate (gate, up, down).
Routed experts are sized either by `expert_bits` (bits per weight incl. scales, a QUANT_BITS name's value) or, when
`expert_format` is set (a name in freetoken.quant.FORMAT_SPECS, or a checkpoint's QuantFormat), exactly as the
engine's packed layout holds them (freetoken.quant.expert_bytes over gate, up [I, D] and down [D, I]).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from freetoken.paths import CONF_DIR
from freetoken.quant import FORMAT_SPECS, QuantFormat, format_spec
from freetoken.quant import expert_bytes as matrix_bytes
from freetoken.sim.config_file import build, read_mapping, require_positive, resolve

MODEL_DIR = CONF_DIR / "model"

# Bits per weight including scales, by storage format; engines name one to override a card's default.
QUANT_BITS: dict[str, float] = {
    "bf16": 16.0,
    "fp8": 8.0,  # e4m3 + one fp32 scale per 128x128 block (DeepSeek-V3): +0.002
    "int4": 4.25,  # 4-bit + one fp16 scale per 64 weights (GPTQ/AWQ/AutoRound-style groups)
    "mxfp4": 4.25,  # 4-bit + one e8m0 scale per 32 (OCP MX spec; gpt-oss experts)
    "nvfp4": 4.5,  # 4-bit + one fp8 scale per 16 (NVIDIA NVFP4)
    "q4_k_m": 4.85,  # llama.cpp Q4_K_M mix (Q4_K 4.5 bpw, Q6_K 6.56 bpw for part of ffn_down); llama.cpp quantize table
    # other GGUF types, bits per weight from llama.cpp's quantize table (tools/quantize/README.md)
    "q2_k": 2.63, "q3_k_m": 3.91, "q4_0": 4.5, "iq4_xs": 4.25, "q5_k_m": 5.69, "q6_k": 6.56, "q8_0": 8.5,
}

COMPUTE_DTYPES = ("bf16", "fp8", "int4", "int8")
LINEAR_CHUNK = 64  # tokens per chunk of the chunked delta-rule kernels (FLA's chunk_gated_delta_rule, BT = 64)

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
    expert_format: QuantFormat | None = None  # exact packed format of the routed experts; sets expert_bits
    expert_bias_params: int = 0  # per expert, stored beside its weights at dense_bits (gpt-oss: gate_up 2I + down D)
    state_bytes_per_sequence: int = 0  # linear-attention layers' conv + recurrent (fp32) states, any context length
    kv_head_dim: int = 128  # values per cached head vector (one fp8 KV scale each): gpt-oss 64, an MLA latent 576
    kv_bits: float = 16.0  # bits per cached value that kv_bytes_per_token counts, scales included (fp32 checkpoint: 32)
    # Gated DeltaNet layers (no KV): their chunked delta-rule FLOPs (linear_flops_per_token); states as above
    linear_layers: int = 0
    linear_heads: int = 0  # value heads, each with a [key_head_dim, value_head_dim] recurrent state
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    max_context: int = 0  # tokens the model's positions cover (config.json max_position_embeddings); 0: not stated

    def __post_init__(self) -> None:
        if isinstance(self.expert_format, str):  # a YAML card names a format
            object.__setattr__(self, "expert_format", format_spec(self.expert_format))
        if self.expert_format is not None:
            object.__setattr__(self, "expert_bits", 8 * (self.expert_bytes() - self.bias_bytes()) / self.expert_params)
        require_positive(self, ("num_layers", "moe_layers", "num_experts", "top_k", "hidden_size",
                                "expert_intermediate_size", "dense_params", "kv_bytes_per_token", "kv_head_dim",
                                "kv_bits",
                                "attention_width", "expert_bits", "dense_bits", "total_params", "active_params",
                                "expert_matrices"))
        require_positive(self, ("shared_experts", "embedding_params", "attention_layers", "expert_bias_params",
                                "state_bytes_per_sequence", "linear_layers", "linear_heads", "max_context"),
                         allow_zero=True)
        require_positive(self, ("linear_key_head_dim", "linear_value_head_dim"))
        if self.top_k > self.num_experts:
            raise ValueError(f"field 'top_k' ({self.top_k}) exceeds field 'num_experts' ({self.num_experts})")
        if self.moe_layers > self.num_layers:
            raise ValueError(f"field 'moe_layers' ({self.moe_layers}) exceeds field 'num_layers' ({self.num_layers})")
        if self.attention_layers > self.num_layers:
            raise ValueError(f"field 'attention_layers' ({self.attention_layers}) exceeds 'num_layers' "
                             f"({self.num_layers})")
        if self.attention_layers + self.linear_layers > self.num_layers:
            raise ValueError(f"fields 'attention_layers' ({self.attention_layers}) + 'linear_layers' "
                             f"({self.linear_layers}) exceed 'num_layers' ({self.num_layers})")
        if bool(self.linear_layers) != bool(self.linear_heads):
            raise ValueError(f"fields 'linear_layers' ({self.linear_layers}) and 'linear_heads' ({self.linear_heads})"
                             " must both be set (Gated DeltaNet layers) or both be 0")
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

    def linear_flops_per_token(self, tokens_per_sequence: np.ndarray | float) -> np.ndarray | float:
        """FLOPs per token of every Gated DeltaNet layer's chunked delta rule (Yang, Kautz & Hatamizadeh, ICLR 2025,
        the chunkwise WY form FLA and vLLM run), over chunks of c = min(64, tokens per sequence) tokens, per value
        head: K K^T, W = T (beta K), U = T (beta V), Q K^T and its product with V' (c^2 (6 dk + 4 dv) per chunk),
        the triangular inverse T (2 c^3 / 3), and the state's three products U - W h, h + K^T V', Q h (6 c dk dv).
        Decode (c = 1) is the recurrent step's 6 dk dv, about. Short convolution and gates are elementwise: not
        counted."""
        c = np.minimum(LINEAR_CHUNK, tokens_per_sequence)
        dk, dv = self.linear_key_head_dim, self.linear_value_head_dim
        per_head = 6 * dk * dv + c * (6 * dk + 4 * dv) + 2 * c * c / 3
        return self.linear_layers * self.linear_heads * per_head

    def with_quant(self, expert: str | None = None, dense: str | None = None,
                   compute: str | None = None) -> "ModelCard":
        """The same model stored in other formats, its GEMMs at another rate. expert: a format name
        (FORMAT_SPECS: exact packed bytes; wins for mxfp4/nvfp4, which are in both) or a QUANT_BITS name; dense:
        a QUANT_BITS name."""
        from dataclasses import replace

        if expert is not None and expert not in FORMAT_SPECS and expert not in QUANT_BITS:
            raise ValueError(f"unknown expert quantization {expert!r}; valid formats: {', '.join(FORMAT_SPECS)}; "
                             f"bits per weight: {', '.join(QUANT_BITS)}")
        if dense is not None and dense not in QUANT_BITS:
            raise ValueError(f"unknown quantization {dense!r}; valid: {', '.join(QUANT_BITS)}")
        card = replace(self, dense_bits=QUANT_BITS[dense] if dense else self.dense_bits,
                       compute_dtype=compute or self.compute_dtype)
        if expert in FORMAT_SPECS:
            return replace(card, expert_format=format_spec(expert))
        if expert is not None:
            return replace(card, expert_bits=QUANT_BITS[expert], expert_format=None)
        return card

    def with_kv(self, kv_dtype: str) -> "ModelCard":
        """The card with its KV cache stored as kv_dtype (freetoken.kv_dtype): auto keeps the card's bytes, bf16 is
        2 bytes per value, fp8 1 byte per value plus a 4-byte scale per kv_head_dim values."""
        import math
        from dataclasses import replace

        from freetoken.kv_dtype import SCALE_BYTES, check_kv_dtype

        if check_kv_dtype(kv_dtype, "kv_dtype") == "auto":
            return self
        values = self.kv_bytes_per_token * 8 / self.kv_bits
        bits = 16.0 if kv_dtype == "bf16" else 8.0 * (self.kv_head_dim + SCALE_BYTES) / self.kv_head_dim
        return replace(self, kv_bytes_per_token=math.ceil(round(values * bits / 8, 6)), kv_bits=bits)

    def bias_bytes(self) -> int:
        return int(round(self.expert_bias_params * self.dense_bits / 8))

    def expert_bytes(self) -> int:
        """What one fetch moves: the expert's weights (packed when expert_format is set) and its biases."""
        bias = self.bias_bytes()
        if self.expert_format is None:
            return int(round(self.expert_params * self.expert_bits / 8)) + bias
        D, I, fmt = self.hidden_size, self.expert_intermediate_size, self.expert_format
        where = f"model {self.name}: expert_format"
        try:  # gate and up [I, D], down [D, I]
            return (self.expert_matrices - 1) * matrix_bytes(fmt, I, D) + matrix_bytes(fmt, D, I) + bias
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None

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
    """A name in conf/model, a .yaml card, or a local HF checkpoint directory (sim.checkpoint_card)."""
    if Path(name_or_path).expanduser().is_dir():
        from freetoken.sim.checkpoint_card import card_from_checkpoint

        return card_from_checkpoint(Path(name_or_path).expanduser())
    if Path(name_or_path).exists() and Path(name_or_path).suffix not in (".yaml", ".yml"):
        raise ValueError(f"model {name_or_path!r}: neither a checkpoint directory (with config.json) nor a "
                         ".yaml model card")
    if "/" in name_or_path and not Path(name_or_path).exists():
        raise ValueError(f"model {name_or_path!r}: no such checkpoint directory or .yaml model card")
    path = resolve(name_or_path, MODEL_DIR, "model")
    return build(ModelCard, read_mapping(path), str(path))


def model_names() -> list[str]:
    return sorted(p.stem for p in Path(MODEL_DIR).glob("*.yaml"))
