"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): per-head q/k RMSNorm, optional dense layers (mlp_only_layers)."""

from __future__ import annotations

from freetoken.models.config import CheckpointError, ConfigReader, ModelConfig
from freetoken.models.family import Family


def moe_layers(c: ConfigReader) -> tuple[int, ...]:
    """Qwen's rule: a layer is sparse unless listed in mlp_only_layers, every decoder_sparse_step-th layer."""
    layers = c.get("num_hidden_layers", kind=int)
    listed = c.get("mlp_only_layers", default=[])
    if not isinstance(listed, list) or any(isinstance(l, bool) or not isinstance(l, int) or not 0 <= l < layers
                                           for l in listed):
        raise CheckpointError(f"{c.path}: mlp_only_layers must list layer indices in [0, {layers}), got {listed!r}")
    dense_only = set(listed)
    step = c.get("decoder_sparse_step", default=1, kind=int)
    return tuple(l for l in range(layers) if l not in dense_only and step > 0 and (l + 1) % step == 0)


def read_config(c: ConfigReader) -> ModelConfig:
    return ModelConfig(
        **c.common("qwen3_moe"),
        num_experts=c.get("num_experts", "num_local_experts", kind=int),
        expert_intermediate=c.get("moe_intermediate_size", kind=int),
        norm_topk_prob=bool(c.get("norm_topk_prob", default=False)),
        moe_layers=moe_layers(c),
        dense_intermediate=c.get("intermediate_size", default=0, kind=int),
        qk_norm="head",
        attention_bias=bool(c.get("attention_bias", default=False)),
    )


FAMILY = Family("qwen3_moe", ("Qwen3MoeForCausalLM",), read_config)
