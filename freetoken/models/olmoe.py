"""OLMoE (OLMoE-1B-7B): q/k RMSNorm over the whole projection (not per head), optional clip_qkv."""

from __future__ import annotations

from freetoken.models.config import ConfigReader, ModelConfig
from freetoken.models.family import Family


def read_config(c: ConfigReader) -> ModelConfig:
    layers = c.get("num_hidden_layers", kind=int)
    clip = c.get("clip_qkv", default=None)
    return ModelConfig(
        **c.common("olmoe"),
        num_experts=c.get("num_experts", "num_local_experts", kind=int),
        expert_intermediate=c.get("intermediate_size", kind=int),
        norm_topk_prob=bool(c.get("norm_topk_prob", default=False)),
        moe_layers=tuple(range(layers)),
        qk_norm="full",
        clip_qkv=None if clip is None else float(clip),
        attention_bias=bool(c.get("attention_bias", default=False)),
    )


FAMILY = Family("olmoe", ("OlmoeForCausalLM",), read_config)
