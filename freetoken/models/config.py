"""The typed model description every architecture family maps its config.json onto."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from freetoken.models.config_v4 import V4Layout

QK_NORMS = ("none", "head", "full")  # no q/k norm | RMSNorm per head (Qwen3) | over the whole projection (OLMoE)


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message names the file and the field or tensor."""


@dataclass(frozen=True, slots=True)
class YarnRope:
    """YaRN rope scaling (gpt-oss): the fields of config.json's rope_parameters (kernels.rope.yarn_inv_freq)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None  # None: 0.1 ln(factor) + 1

    def __post_init__(self) -> None:
        if self.factor <= 0 or self.original_max_position_embeddings <= 0:
            raise CheckpointError(f"config.json: rope_parameters factor {self.factor} and "
                                  f"original_max_position_embeddings {self.original_max_position_embeddings} "
                                  "must be positive")


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude scale 0.1 mscale ln(factor) + 1 (1 for factor <= 1), as HF and DeepSeek compute it."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True, slots=True)
class MLA:
    """DeepSeek's multi-head latent attention (models/deepseek.py, engine/mla.py): q through an optional low-rank
    pair, k/v decompressed per head from a shared latent of kv_lora_rank, rope on qk_rope_head_dim dims only."""

    q_lora_rank: int  # 0: a plain q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool = True  # rope pairs are adjacent dims (2i, 2i + 1) in the checkpoint's rows
    softmax_mscale: float = 1.0  # the softmax scale is qk_head_dim^-0.5 times this (YaRN mscale_all_dim squared)

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(self, name) <= 0:
                raise CheckpointError(f"config.json: {name} must be positive, got {getattr(self, name)}")
        if self.q_lora_rank < 0 or self.qk_rope_head_dim % 2:
            raise CheckpointError(f"config.json: q_lora_rank {self.q_lora_rank} must be >= 0 and qk_rope_head_dim "
                                  f"{self.qk_rope_head_dim} even")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True, slots=True)
class DSA:
    """DeepSeek sparse attention's lightning indexer (GLM-5, engine/dsa.py): each query attends to the index_topk
    earlier keys its indexer scores highest; layers not in indexer_layers reuse the previous indexer layer's picks."""

    index_topk: int
    index_heads: int
    index_head_dim: int
    indexer_layers: tuple[int, ...]  # layers that run their own indexer ("full"); the others share ("shared")

    def __post_init__(self) -> None:
        for name in ("index_topk", "index_heads", "index_head_dim"):
            if getattr(self, name) <= 0:
                raise CheckpointError(f"config.json: {name} must be positive, got {getattr(self, name)}")
        if 0 not in self.indexer_layers:
            raise CheckpointError("config.json: indexer_types must start with a 'full' layer (a shared layer reuses "
                                  "the picks of an earlier one)")


@dataclass(frozen=True, slots=True)
class Routing:
    """How router logits become picks beyond softmax top-k (kernels.router's options; DeepSeek V2 / V3)."""

    score: str = "softmax"  # or "sigmoid"
    n_group: int = 1  # group-limited top-k: the topk_group best of n_group expert groups are eligible
    topk_group: int = 1
    group_score: str = "max"  # a group's score: its best expert, or "top2" its best two summed
    scale: float = 1.0  # routed_scaling_factor on the weights
    correction_bias: bool = False  # a per-expert bias added to the scores for the choice only
    fp32: bool = False  # the gate weight is kept in fp32 and the router runs on h in fp32 (HF's GLM, DeepSeek-V3)

    def options(self) -> dict:
        return dict(score=self.score, n_group=self.n_group, topk_group=self.topk_group,
                    group_score=self.group_score, scale=self.scale)


@dataclass(frozen=True, slots=True)
class LinearAttention:
    """Gated DeltaNet token mixing (Qwen3-Next, Qwen3.5-MoE; engine/gated_deltanet.py) on `layers`; the other decoder
    layers keep full attention. Per sequence each such layer keeps a conv state [conv_dim, conv_kernel - 1] and a
    recurrent state [num_v_heads, k_head_dim, v_head_dim] (fp32) instead of KV."""

    layers: tuple[int, ...]
    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int
    fused_projections: bool = False  # Qwen3-Next's in_proj_qkvz / in_proj_ba, grouped by key head

    def __post_init__(self) -> None:
        for name in ("num_k_heads", "num_v_heads", "k_head_dim", "v_head_dim", "conv_kernel"):
            if getattr(self, name) <= 0:
                raise CheckpointError(f"config.json: linear-attention {name} must be positive, got {getattr(self, name)}")
        if self.num_v_heads % self.num_k_heads:
            raise CheckpointError(f"config.json: linear_num_value_heads {self.num_v_heads} is not a multiple of "
                                  f"linear_num_key_heads {self.num_k_heads}")

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the short convolution: q, k and v concatenated."""
        return 2 * self.key_dim + self.value_dim

    def state_values(self) -> tuple[int, int]:
        """(conv state values, recurrent state values) of one layer for one sequence."""
        return self.conv_dim * (self.conv_kernel - 1), self.num_v_heads * self.k_head_dim * self.v_head_dim


@dataclass(frozen=True, slots=True)
class ModelConfig:
    family: str
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int  # decoder layers
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    num_experts: int
    top_k: int
    expert_intermediate: int
    norm_topk_prob: bool
    moe_layers: tuple[int, ...]  # decoder layers with a routed MoE block; the others run a dense MLP
    dense_intermediate: int = 0  # the dense MLP of non-MoE layers
    shared_expert_intermediate: int = 0  # > 0: every MoE layer also runs one always-on shared expert
    shared_expert_gate: bool = False  # the shared expert's output is scaled by sigmoid(h @ w_gate) (Qwen2-MoE)
    qk_norm: str = "none"
    clip_qkv: float | None = None
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # gpt-oss
    o_proj_bias: bool = False  # the attention output projection has a bias too
    attention_sinks: bool = False  # a learned logit per head joins the softmax denominator
    sliding_window: int = 0  # the layers in sliding_layers attend to the last sliding_window keys only
    sliding_layers: tuple[int, ...] = ()
    rope_yarn: YarnRope | None = None
    router_bias: bool = False
    expert_bias: bool = False  # every expert has a gate_up [2I] and a down [D] bias
    expert_glu: str = "silu"  # the experts' gated activation (kernels.expert_ffn.GLUS), its gain and clamp:
    glu_alpha: float = 1.702
    glu_limit: float = 7.0
    # DeepSeek V2 / V3
    mla: MLA | None = None  # multi-head latent attention instead of q/k/v/o (head_dim: the padded cache head dim)
    routing: Routing = Routing()
    # Qwen3-Next / Qwen3.5-MoE
    linear_attention: LinearAttention | None = None  # Gated DeltaNet layers (no KV)
    attention_output_gate: bool = False  # q_proj also yields a per-head gate: o *= sigmoid(gate) before o_proj
    norm_unit_offset: bool = False  # every RMSNorm weight is stored as w - 1 (the norm multiplies by 1 + w)
    rotary_dim: int = 0  # rope on the first rotary_dim dims of each head (0: all of head_dim)
    dsa: DSA | None = None  # sparse attention over MLA (GLM-5)
    v4: V4Layout | None = None  # DeepSeek-V4's compressed attention, hyper-connections and hash routing

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "num_experts", "top_k", "expert_intermediate"):
            if getattr(self, name) <= 0:
                raise CheckpointError(f"config.json: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(f"config.json: num_attention_heads {self.num_heads} is not a multiple of "
                                  f"num_key_value_heads {self.num_kv_heads}")
        if self.top_k > self.num_experts:
            raise CheckpointError(f"config.json: num_experts_per_tok {self.top_k} exceeds the {self.num_experts} "
                                  "experts")
        if self.qk_norm not in QK_NORMS:
            raise CheckpointError(f"qk_norm {self.qk_norm!r} is not one of {', '.join(QK_NORMS)}")
        if not self.moe_layers:
            raise CheckpointError("config.json: the model has no MoE layer")
        if any(not 0 <= l < self.num_layers for l in self.moe_layers):
            raise CheckpointError(f"config.json: MoE layers {self.moe_layers} outside [0, {self.num_layers})")
        if len(self.moe_layers) < self.num_layers and self.dense_intermediate <= 0:
            raise CheckpointError("config.json: dense layers need a positive intermediate_size")
        if any(not 0 <= l < self.num_layers for l in self.sliding_layers):
            raise CheckpointError(f"config.json: sliding-window layers {self.sliding_layers} outside "
                                  f"[0, {self.num_layers})")
        if self.sliding_layers and self.sliding_window <= 0:
            raise CheckpointError(f"config.json: sliding_window must be positive, got {self.sliding_window}")
        if self.rotary_dim < 0 or self.rotary_dim > self.head_dim or self.rotary_dim % 2:
            raise CheckpointError(f"config.json: rotary dims {self.rotary_dim} must be even and within head_dim "
                                  f"{self.head_dim}")
        if self.linear_attention is not None and any(not 0 <= l < self.num_layers for l in self.linear_attention.layers):
            raise CheckpointError(f"config.json: linear-attention layers {self.linear_attention.layers} outside "
                                  f"[0, {self.num_layers})")

    def index_key_values(self) -> int:
        """DSA: the indexer keys one token adds to the cache beside its KV (every indexer layer's index_head_dim)."""
        return 0 if self.dsa is None else len(self.dsa.indexer_layers) * self.dsa.index_head_dim

    def is_linear(self, layer: int) -> bool:
        """Does the decoder layer mix tokens with Gated DeltaNet (no KV) rather than attention?"""
        return self.linear_attention is not None and layer in self.linear_attention.layers

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Decoder layers that keep KV (all but the linear-attention ones)."""
        return tuple(l for l in range(self.num_layers) if not self.is_linear(l))

    def state_bytes(self, dtype_bytes: int) -> int:
        """One sequence's linear-attention states (engine/hybrid_kv.py): conv at dtype_bytes, recurrent in fp32;
        DeepSeek-V4's compressor window rows (engine/v4_kv.py) at dtype_bytes."""
        if self.v4 is not None:
            return self.v4.state_values(self.head_dim) * dtype_bytes
        if self.linear_attention is None:
            return 0
        conv, recurrent = self.linear_attention.state_values()
        return len(self.linear_attention.layers) * (conv * dtype_bytes + recurrent * 4)

    def window(self, layer: int) -> int | None:
        """The sliding window of a decoder layer, None where it attends to every earlier key."""
        return self.sliding_window if layer in self.sliding_layers else None

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layers)

    def moe_index(self, layer: int) -> int:
        """Decoder layer -> MoE layer index (the `layer` of Calls and traces), -1 for a dense layer."""
        try:
            return self.moe_layers.index(layer)
        except ValueError:
            return -1


class ConfigReader:
    """Reads fields of one config.json; a missing or mistyped field is a CheckpointError naming file and field."""

    def __init__(self, raw: dict, path: str):
        self.raw = raw
        self.path = path

    def get(self, *names: str, default: Any = ..., kind: type | None = None) -> Any:
        for name in names:
            if name in self.raw and self.raw[name] is not None:
                value = self.raw[name]
                break
        else:
            if default is ...:
                raise CheckpointError(f"{self.path}: missing field {' / '.join(repr(n) for n in names)}")
            return default
        if kind is not None:
            if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise CheckpointError(f"{self.path}: field {names[0]!r} must be an integer, got {value!r}")
            if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
                raise CheckpointError(f"{self.path}: field {names[0]!r} must be a finite number, got {value!r}")
            if kind is bool and not isinstance(value, bool):
                raise CheckpointError(f"{self.path}: field {names[0]!r} must be true or false, got {value!r}")
            value = kind(value)
        return value

    def rope_params(self) -> tuple[str, dict]:
        params = self.raw.get("rope_parameters") or self.raw.get("rope_scaling") or {}
        if not isinstance(params, dict):
            return "default", {}
        return params.get("rope_type", params.get("type", "default")) or "default", params

    def rope_theta(self, default: float = 10000.0, rope_types: tuple[str, ...] = ("default",)) -> float:
        rope_type, params = self.rope_params()
        if rope_type not in rope_types:
            raise CheckpointError(f"{self.path}: rope type {rope_type!r} is not supported (supported here: "
                                  f"{', '.join(rope_types)})")
        if isinstance(params, dict) and "rope_theta" in params:
            return float(params["rope_theta"])
        return self.get("rope_theta", default=default, kind=float)

    def rotary_dim(self, head_dim: int, default_factor: float = 1.0) -> int:
        """Partial rotary: int(head_dim x partial_rotary_factor) as HF's rope init computes it, the factor from
        rope_parameters / rope_scaling or the top level, else a `rotary_dim` field (MiniMax-M2), else the default."""
        _, params = self.rope_params()
        factor = params.get("partial_rotary_factor") if isinstance(params, dict) else None
        if factor is None:
            factor = self.raw.get("partial_rotary_factor")
        if factor is None and self.raw.get("rotary_dim") is not None:
            factor = self.get("rotary_dim", kind=int) / head_dim
        factor = default_factor if factor is None else factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
            raise CheckpointError(f"{self.path}: partial_rotary_factor / rotary_dim must give a fraction in (0, 1] "
                                  f"of head_dim {head_dim}, got {factor!r}")
        return int(head_dim * factor)

    def eos_ids(self) -> tuple[int, ...]:
        eos = self.raw.get("eos_token_id")
        if eos is None:
            return ()
        return tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))

    def yarn(self) -> YarnRope | None:
        """rope_parameters of rope_type 'yarn' (None for the default rope); a missing field is named."""
        rope_type, params = self.rope_params()
        if rope_type != "yarn":
            return None
        sub = ConfigReader(params, f"{self.path} rope_parameters")
        factor = sub.get("factor", kind=float)
        attention = sub.get("attention_factor", default=None)
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        if attention is None and mscale and mscale_all:  # DeepSeek: HF's ratio of the two magnitude scales
            attention = yarn_mscale(factor, float(mscale)) / yarn_mscale(factor, float(mscale_all))
        return YarnRope(factor, sub.get("original_max_position_embeddings", kind=int),
                        sub.get("beta_fast", default=32.0, kind=float), sub.get("beta_slow", default=1.0, kind=float),
                        bool(sub.get("truncate", default=True)), attention)

    def common(self, family: str, rope_types: tuple[str, ...] = ("default",), rope_theta: float = 10000.0) -> dict:
        """The fields every Llama-like decoder shares."""
        hidden = self.get("hidden_size", kind=int)
        heads = self.get("num_attention_heads", kind=int)
        head_dim = self.get("head_dim", default=None, kind=int)
        if head_dim is None and (heads <= 0 or hidden % heads):
            raise CheckpointError(f"{self.path}: without head_dim, hidden_size {hidden} must be a multiple of "
                                  f"num_attention_heads {heads}")
        archs = self.raw.get("architectures") or [family]
        return dict(
            family=family,
            architecture=archs[0],
            vocab_size=self.get("vocab_size", kind=int),
            hidden_size=hidden,
            num_layers=self.get("num_hidden_layers", kind=int),
            num_heads=heads,
            num_kv_heads=self.get("num_key_value_heads", default=heads, kind=int),
            head_dim=int(head_dim) if head_dim is not None else hidden // heads,
            rope_theta=self.rope_theta(rope_theta, rope_types),
            rms_norm_eps=self.get("rms_norm_eps", default=1e-6, kind=float),
            top_k=self.get("num_experts_per_tok", kind=int),
            tie_word_embeddings=bool(self.get("tie_word_embeddings", default=False)),
            max_position_embeddings=self.get("max_position_embeddings", default=4096, kind=int),
            bos_token_id=self.get("bos_token_id", default=None),
            eos_token_ids=self.eos_ids(),
        )
