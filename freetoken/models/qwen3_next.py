"""Qwen3-Next (Qwen3-Next-80B-A3B) and Qwen3.5 / 3.6-MoE (Qwen3.5-122B-A10B, Qwen3.6-35B-A3B): hybrid decoders.

Most layers mix tokens with Gated DeltaNet (config.LinearAttention, engine/gated_deltanet.py), every
full_attention_interval-th one with gated full attention (q_proj yields q and a per-head output gate, o *=
sigmoid(gate); per-head q/k RMSNorm; rope on the first partial_rotary_factor of each head). Every RMSNorm but the
DeltaNet output norm multiplies by (1 + w). MoE: softmax top-k (renormalised) plus a shared expert scaled by a
sigmoid gate. Qwen3-Next packs the DeltaNet input projections per key head (in_proj_qkvz, in_proj_ba); Qwen3.5 keeps
them apart (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a) and has no dense layers. The multimodal
Qwen3_5MoeForConditionalGeneration checkpoint is served text-only: its text model lives under
model.language_model., its vision tower (model.visual.) and multi-token-prediction head (mtp.) are not loaded.
"""

from __future__ import annotations

from freetoken.models.config import CheckpointError, ConfigReader, LinearAttention, ModelConfig
from freetoken.models.family import Family
from freetoken.models.qwen3_moe import moe_layers

LAYER_TYPES = ("linear_attention", "full_attention")
LINEAR = "model.layers.{l}.linear_attn."


def linear_layers(c: ConfigReader, layers: int) -> tuple[int, ...]:
    """layer_types as HF's Qwen3NextConfig reads it (absent: every full_attention_interval-th layer is full)."""
    types = c.get("layer_types", default=None)
    if types is None:
        interval = c.get("full_attention_interval", default=4, kind=int)
        types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers:
        raise CheckpointError(f"{c.path}: layer_types must list one type per layer ({layers}), got {types!r}")
    for i, t in enumerate(types):
        if t not in LAYER_TYPES:
            raise CheckpointError(f"{c.path}: layer_types[{i}] {t!r} is not one of {', '.join(LAYER_TYPES)}")
    return tuple(i for i, t in enumerate(types) if t == "linear_attention")


def _rotary_dim(c: ConfigReader, head_dim: int) -> int:
    _, params = c.rope_params()
    factor = params.get("partial_rotary_factor", c.get("partial_rotary_factor", default=0.25, kind=float))
    return int(head_dim * float(factor))


def _read(c: ConfigReader, family: str, fused: bool) -> ModelConfig:
    layers = c.get("num_hidden_layers", kind=int)
    if c.get("hidden_act", default="silu") != "silu":
        raise CheckpointError(f"{c.path}: hidden_act {c.raw['hidden_act']!r} is not supported (silu only)")
    common = c.common(family)
    common["head_dim"] = c.get("head_dim", default=256, kind=int)  # HF's Qwen3NextConfig default
    linear = LinearAttention(
        layers=linear_layers(c, layers),
        num_k_heads=c.get("linear_num_key_heads", default=16, kind=int),
        num_v_heads=c.get("linear_num_value_heads", default=32, kind=int),
        k_head_dim=c.get("linear_key_head_dim", default=128, kind=int),
        v_head_dim=c.get("linear_value_head_dim", default=128, kind=int),
        conv_kernel=c.get("linear_conv_kernel_dim", default=4, kind=int),
        fused_projections=fused)
    return ModelConfig(
        **common,
        num_experts=c.get("num_experts", kind=int),
        expert_intermediate=c.get("moe_intermediate_size", kind=int),
        norm_topk_prob=bool(c.get("norm_topk_prob", default=True)) if fused else True,  # Qwen3.5 always renormalises
        moe_layers=moe_layers(c) if fused else tuple(range(layers)),
        dense_intermediate=c.get("intermediate_size", default=0, kind=int) if fused else 0,
        shared_expert_intermediate=c.get("shared_expert_intermediate_size", kind=int),
        shared_expert_gate=True,
        qk_norm="head",
        attention_bias=bool(c.get("attention_bias", default=False)),
        linear_attention=linear,
        attention_output_gate=True,
        norm_unit_offset=True,
        rotary_dim=_rotary_dim(c, common["head_dim"]),
    )


def read_qwen3_next(c: ConfigReader) -> ModelConfig:
    return _read(c, "qwen3_next", fused=True)


def read_qwen3_5_moe(c: ConfigReader) -> ModelConfig:
    return _read(c, "qwen3_5_moe", fused=False)


def read_qwen3_5_moe_multimodal(c: ConfigReader) -> ModelConfig:
    """The text model of a Qwen3_5MoeForConditionalGeneration config.json (its text_config)."""
    text = c.get("text_config")
    if not isinstance(text, dict):
        raise CheckpointError(f"{c.path}: text_config must be an object")
    raw = {"tie_word_embeddings": c.raw.get("tie_word_embeddings", False), **text,
           "architectures": c.raw.get("architectures")}
    return _read(ConfigReader(raw, f"{c.path} text_config"), "qwen3_5_moe", fused=False)


def linear_attention_tensors(cfg: ModelConfig, layer: int) -> dict[str, tuple[int, ...]]:
    """A Gated DeltaNet layer's tensors -> shapes (Qwen3-Next's packed projections or Qwen3.5's four)."""
    la, D, p = cfg.linear_attention, cfg.hidden_size, LINEAR.format(l=layer)
    out: dict[str, tuple[int, ...]] = {}
    if la.fused_projections:
        out[p + "in_proj_qkvz.weight"] = (2 * la.key_dim + 2 * la.value_dim, D)
        out[p + "in_proj_ba.weight"] = (2 * la.num_v_heads, D)
    else:
        out[p + "in_proj_qkv.weight"] = (la.conv_dim, D)
        out[p + "in_proj_z.weight"] = (la.value_dim, D)
        out[p + "in_proj_b.weight"] = (la.num_v_heads, D)
        out[p + "in_proj_a.weight"] = (la.num_v_heads, D)
    out[p + "conv1d.weight"] = (la.conv_dim, 1, la.conv_kernel)
    out[p + "dt_bias"] = (la.num_v_heads,)
    out[p + "A_log"] = (la.num_v_heads,)
    out[p + "norm.weight"] = (la.v_head_dim,)
    out[p + "out_proj.weight"] = (D, la.value_dim)
    return out


FAMILY = Family("qwen3_next", ("Qwen3NextForCausalLM",), read_qwen3_next, linear_attention=linear_attention_tensors)
FAMILY_3_5 = Family("qwen3_5_moe", ("Qwen3_5MoeForCausalLM",), read_qwen3_5_moe,
                    linear_attention=linear_attention_tensors)
FAMILY_3_5_MULTIMODAL = Family("qwen3_5_moe_multimodal", ("Qwen3_5MoeForConditionalGeneration",),
                               read_qwen3_5_moe_multimodal, linear_attention=linear_attention_tensors,
                               text_prefix="language_model.", skip_prefixes=("model.visual.", "mtp."))
