"""Mixtral (8x7B, 8x22B): experts under block_sparse_moe as w1 (gate), w3 (up), w2 (down); top-k renormalised."""

from __future__ import annotations

from freetoken.models.config import ConfigReader, ModelConfig
from freetoken.models.family import Family


def read_config(c: ConfigReader) -> ModelConfig:
    layers = c.get("num_hidden_layers", kind=int)
    return ModelConfig(
        **c.common("mixtral"),
        num_experts=c.get("num_local_experts", kind=int),
        expert_intermediate=c.get("intermediate_size", kind=int),
        norm_topk_prob=True,  # softmax over the top-k logits = top-k of the softmax, renormalised
        moe_layers=tuple(range(layers)),
    )


FAMILY = Family("mixtral", ("MixtralForCausalLM",), read_config, moe_prefix="model.layers.{l}.block_sparse_moe.",
                expert="experts.{e}.{p}.weight", expert_proj=("w1", "w3", "w2"))
