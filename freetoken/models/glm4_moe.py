"""GLM-4.5 / 4.6 / 4.7 (Glm4MoeForCausalLM): GQA attention with q/k/v biases (attention_bias; o_proj never has one),
optional per-head q/k RMSNorm (use_qk_norm), rope on the first partial_rotary_factor of each head (default 0.5,
rotate_half pairs), the first first_k_dense_replace layers dense, every other layer routed with always-on shared
experts (n_shared_experts x moe_intermediate_size, no gate) and DeepSeek-V3's routing: sigmoid scores plus
e_score_correction_bias for the choice only, top-2 group scores over n_group / topk_group, the picks' unbiased
scores renormalised (norm_topk_prob) and times routed_scaling_factor (config.Routing, kernels/router.py).

The multi-token-prediction layers past num_hidden_layers (num_nextn_predict_layers) are not read, as HF ignores them.
"""

from __future__ import annotations

from freetoken.models.config import ConfigReader, ModelConfig, Routing
from freetoken.models.family import Family


def read_config(c: ConfigReader) -> ModelConfig:
    layers = c.get("num_hidden_layers", kind=int)
    first_dense = c.get("first_k_dense_replace", default=1, kind=int)  # HF's Glm4MoeConfig default
    common = c.common("glm4_moe")
    moe_intermediate = c.get("moe_intermediate_size", kind=int)
    n_group = max(c.get("n_group", default=1, kind=int), 1)
    return ModelConfig(
        **common,
        num_experts=c.get("n_routed_experts", "num_local_experts", kind=int),
        expert_intermediate=moe_intermediate,
        norm_topk_prob=bool(c.get("norm_topk_prob", default=True)),
        moe_layers=tuple(range(first_dense, layers)),
        dense_intermediate=c.get("intermediate_size", default=0, kind=int),
        shared_expert_intermediate=c.get("n_shared_experts", default=1, kind=int) * moe_intermediate,
        qk_norm="head" if c.get("use_qk_norm", default=False) else "none",
        attention_bias=bool(c.get("attention_bias", default=False)),
        routing=Routing(score="sigmoid", n_group=n_group, topk_group=max(c.get("topk_group", default=1, kind=int), 1),
                        group_score="top2", scale=c.get("routed_scaling_factor", default=1.0, kind=float),
                        correction_bias=True, fp32=True),
        rotary_dim=c.rotary_dim(common["head_dim"], default_factor=0.5),  # HF's Glm4MoeConfig default
    )


FAMILY = Family("glm4_moe", ("Glm4MoeForCausalLM",), read_config, shared_expert="shared_experts.")
