"""DeepSeek-V2 / V2-Lite / V3 / R1: multi-head latent attention (config.MLA, engine/mla.py), the first
first_k_dense_replace layers dense, every other layer routed with always-on shared experts (n_shared_experts x
moe_intermediate_size, no gate) and DeepSeek's routing (config.Routing):

- V2: softmax scores, top-k greedy or group_limited_greedy (a group scored by its best expert), weights times
  routed_scaling_factor, not renormalised (HF's DeepseekV2TopkRouter ignores norm_topk_prob, so does this family);
- V3: sigmoid scores plus e_score_correction_bias for the choice only, groups scored by their best two, the picks'
  unbiased scores renormalised (norm_topk_prob) and times routed_scaling_factor.

Rope: YaRN with mscale / mscale_all_dim (the softmax scale gains mscale_all_dim's magnitude scale squared) or the
default rope, over qk_rope_head_dim dims; pairs interleaved in the checkpoint rows (V2 always, V3 rope_interleave).
"""

from __future__ import annotations

from freetoken.models.config import MLA, CheckpointError, ConfigReader, ModelConfig, Routing, yarn_mscale
from freetoken.models.family import ATTN, Family

TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


def _mla(c: ConfigReader, interleave: bool) -> MLA:
    rope_type, params = c.rope_params()
    softmax_mscale = 1.0
    if rope_type != "default" and params.get("mscale_all_dim"):
        m = yarn_mscale(float(params["factor"]), float(params["mscale_all_dim"]))
        softmax_mscale = m * m
    return MLA(q_lora_rank=c.get("q_lora_rank", default=0, kind=int), kv_lora_rank=c.get("kv_lora_rank", kind=int),
               qk_nope_head_dim=c.get("qk_nope_head_dim", kind=int), qk_rope_head_dim=c.get("qk_rope_head_dim", kind=int),
               v_head_dim=c.get("v_head_dim", kind=int), rope_interleave=interleave, softmax_mscale=softmax_mscale)


def _routing(c: ConfigReader, v3: bool) -> Routing:
    method = c.get("topk_method", default="noaux_tc" if v3 else "greedy")
    if method not in TOPK_METHODS:
        raise CheckpointError(f"{c.path}: topk_method {method!r} is not one of {', '.join(TOPK_METHODS)}")
    grouped = v3 or method == "group_limited_greedy"
    n_group = c.get("n_group", default=1, kind=int) if grouped else 1
    topk_group = c.get("topk_group", default=n_group, kind=int) if grouped else 1
    return Routing(score="sigmoid" if v3 else "softmax", n_group=max(n_group, 1), topk_group=max(topk_group, 1),
                   group_score="top2" if v3 else "max", scale=c.get("routed_scaling_factor", default=1.0, kind=float),
                   correction_bias=v3)


def read_config(c: ConfigReader) -> ModelConfig:
    v3 = (c.raw.get("architectures") or ["DeepseekV3"])[0].startswith("DeepseekV3") or c.raw.get("model_type") == "deepseek_v3"
    mla = _mla(c, bool(c.get("rope_interleave", default=True)) if v3 else True)
    layers = c.get("num_hidden_layers", kind=int)
    first_dense = c.get("first_k_dense_replace", default=0, kind=int)
    freq = c.get("moe_layer_freq", default=1, kind=int)
    common = c.common("deepseek_v3" if v3 else "deepseek_v2", rope_types=("default", "yarn"))
    common.update(num_kv_heads=common["num_heads"], head_dim=max(mla.qk_head_dim, mla.v_head_dim))
    n_shared = c.get("n_shared_experts", default=0, kind=int)
    moe_intermediate = c.get("moe_intermediate_size", kind=int)
    return ModelConfig(
        **common,
        num_experts=c.get("n_routed_experts", "num_experts", kind=int),
        expert_intermediate=moe_intermediate,
        norm_topk_prob=bool(c.get("norm_topk_prob", default=True)) if v3 else False,
        moe_layers=tuple(l for l in range(first_dense, layers) if l % freq == 0),
        dense_intermediate=c.get("intermediate_size", default=0, kind=int),
        shared_expert_intermediate=n_shared * moe_intermediate,
        attention_bias=bool(c.get("attention_bias", default=False)),
        rope_yarn=c.yarn(),
        mla=mla,
        routing=_routing(c, v3),
    )


def attention_tensors(cfg: ModelConfig, layer: int) -> dict[str, tuple[int, ...]]:
    """MLA's tensors of one layer -> shapes (q_a_proj / q_a_layernorm / q_b_proj, or q_proj)."""
    m, D, H, a = cfg.mla, cfg.hidden_size, cfg.num_heads, ATTN.format(l=layer)
    out: dict[str, tuple[int, ...]] = {}
    if m.q_lora_rank:
        out[a + "q_a_proj.weight"] = (m.q_lora_rank, D)
        out[a + "q_a_layernorm.weight"] = (m.q_lora_rank,)
        out[a + "q_b_proj.weight"] = (H * m.qk_head_dim, m.q_lora_rank)
    else:
        out[a + "q_proj.weight"] = (H * m.qk_head_dim, D)
    out[a + "kv_a_proj_with_mqa.weight"] = (m.kv_lora_rank + m.qk_rope_head_dim, D)
    out[a + "kv_a_layernorm.weight"] = (m.kv_lora_rank,)
    out[a + "kv_b_proj.weight"] = (H * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)
    out[a + "o_proj.weight"] = (D, H * m.v_head_dim)
    if cfg.attention_bias:
        if m.q_lora_rank:
            out[a + "q_a_proj.bias"] = (m.q_lora_rank,)
        out[a + "kv_a_proj_with_mqa.bias"] = (m.kv_lora_rank + m.qk_rope_head_dim,)
        out[a + "o_proj.bias"] = (D,)
    return out


FAMILY = Family("deepseek", ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"), read_config,
                shared_expert="shared_experts.", attention=attention_tensors)
