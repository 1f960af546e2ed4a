"""MiniMax-M2 / M2.1 / M2.5 (MiniMaxM2ForCausalLM): GQA attention with q/k RMSNorm over the whole projection (before
the heads are split, as OLMoE), rope on the first rotary_dim dims of each head (rotate_half pairs), every layer
routed (no dense layers, no shared expert): sigmoid scores plus a per-expert e_score_correction_bias for the choice
only, the picks' unbiased scores always renormalised (HF's MiniMaxM2TopKRouter), no groups, no scaling. Tensors in
Mixtral's hub layout: block_sparse_moe.gate, experts.E.{w1, w3, w2} (gate, up, down) and the correction bias
beside the gate as block_sparse_moe.e_score_correction_bias.

The multi-token-prediction modules (use_mtp, num_mtp_modules) are not read, as HF ignores them.
"""

from __future__ import annotations

from freetoken.models.config import CheckpointError, ConfigReader, ModelConfig, Routing
from freetoken.models.family import Family


def read_config(c: ConfigReader) -> ModelConfig:
    scoring = c.get("scoring_func", default="sigmoid")
    if scoring != "sigmoid":
        raise CheckpointError(f"{c.path}: scoring_func {scoring!r} is not supported (MiniMax-M2 routes by sigmoid)")
    if c.get("use_qk_norm", default=True) is False or c.get("qk_norm_type", default="per_layer") != "per_layer":
        raise CheckpointError(f"{c.path}: only use_qk_norm true with qk_norm_type 'per_layer' is supported")
    layers = c.get("num_hidden_layers", kind=int)
    common = c.common("minimax_m2", rope_theta=5000000.0)  # HF's MiniMaxM2Config default theta
    return ModelConfig(
        **common,
        num_experts=c.get("num_local_experts", "num_experts", kind=int),
        expert_intermediate=c.get("intermediate_size", kind=int),
        norm_topk_prob=True,
        moe_layers=tuple(range(layers)),
        qk_norm="full",
        routing=Routing(score="sigmoid", correction_bias=True),
        rotary_dim=c.rotary_dim(common["head_dim"]),
    )


FAMILY = Family("minimax_m2", ("MiniMaxM2ForCausalLM",), read_config, moe_prefix="model.layers.{l}.block_sparse_moe.",
                expert_proj=("w1", "w3", "w2"), correction_bias="e_score_correction_bias")
