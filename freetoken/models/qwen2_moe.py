"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): q/k/v biases, one shared expert per MoE layer whose output is
scaled by a sigmoid gate; top-k not renormalised by default."""

from __future__ import annotations

from freetoken.models.config import CheckpointError, ConfigReader, ModelConfig
from freetoken.models.family import Family
from freetoken.models.qwen3_moe import moe_layers


def read_config(c: ConfigReader) -> ModelConfig:
    if c.get("use_sliding_window", default=False):
        raise CheckpointError(f"{c.path}: use_sliding_window is not supported (sliding-window attention)")
    return ModelConfig(
        **c.common("qwen2_moe"),
        num_experts=c.get("num_experts", "num_local_experts", kind=int),
        expert_intermediate=c.get("moe_intermediate_size", kind=int),
        norm_topk_prob=bool(c.get("norm_topk_prob", default=False)),
        moe_layers=moe_layers(c),
        dense_intermediate=c.get("intermediate_size", default=0, kind=int),
        shared_expert_intermediate=c.get("shared_expert_intermediate_size", kind=int),
        shared_expert_gate=True,
        attention_bias=bool(c.get("qkv_bias", default=True)),
    )


FAMILY = Family("qwen2_moe", ("Qwen2MoeForCausalLM",), read_config)
