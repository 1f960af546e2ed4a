"""gpt-oss (gpt-oss-20b, gpt-oss-120b): attention sinks, sliding-window attention on the layers layer_types marks
"sliding_attention", q/k/v/o biases, YaRN rope, a router with a bias (top-k of the logits, softmax over those k),
experts with biases and the clamped gated activation, stored fused as x @ W with gate and up columns interleaved
(family.py's "gpt_oss" layout; MXFP4 checkpoints keep the same interleaving in their packed rows)."""

from __future__ import annotations

from freetoken.models.config import CheckpointError, ConfigReader, ModelConfig
from freetoken.models.family import Family

LAYER_TYPES = ("sliding_attention", "full_attention")


def sliding_layers(c: ConfigReader, layers: int) -> tuple[int, ...]:
    """layer_types as HF's GptOssConfig reads it (absent: even layers slide)."""
    types = c.get("layer_types", default=None)
    if types is None:
        return tuple(range(0, layers, 2))
    if not isinstance(types, list) or len(types) != layers or any(t not in LAYER_TYPES for t in types):
        raise CheckpointError(f"{c.path}: layer_types must list one of {', '.join(LAYER_TYPES)} per layer "
                              f"({layers}), got {types!r}")
    return tuple(l for l, t in enumerate(types) if t == "sliding_attention")


def read_config(c: ConfigReader) -> ModelConfig:
    if "num_experts_per_tok" not in c.raw:  # openai's own name; HF's GptOssConfig defaults it to 4
        c = ConfigReader({**c.raw, "num_experts_per_tok": c.get("experts_per_token", default=4, kind=int)}, c.path)
    layers = c.get("num_hidden_layers", kind=int)
    slide = sliding_layers(c, layers)
    bias = bool(c.get("attention_bias", default=True))
    return ModelConfig(
        **c.common("gpt_oss", rope_types=("default", "yarn"), rope_theta=150000.0),  # HF's gpt-oss default theta
        num_experts=c.get("num_local_experts", "num_experts", kind=int),
        expert_intermediate=c.get("intermediate_size", kind=int),
        norm_topk_prob=True,  # softmax over the top-k logits = top-k of the softmax, renormalised
        moe_layers=tuple(range(layers)),
        attention_bias=bias,
        o_proj_bias=bias,
        attention_sinks=True,
        sliding_window=c.get("sliding_window", kind=int) if slide else 0,
        sliding_layers=slide,
        rope_yarn=c.yarn(),
        router_bias=True,
        expert_bias=True,
        expert_glu="clamped",
        glu_alpha=c.get("swiglu_alpha", default=1.702, kind=float),
        glu_limit=c.get("swiglu_limit", default=7.0, kind=float),
    )


FAMILY = Family("gpt_oss", ("GptOssForCausalLM",), read_config, router="router.weight", router_bias="router.bias",
                expert_layout="gpt_oss")
