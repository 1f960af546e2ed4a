"""GLM-5 (GlmMoeDsaForCausalLM): DeepSeek's multi-head latent attention (q LoRA, rope pairs interleaved) made sparse
by DeepSeek sparse attention's lightning indexer (config.DSA, engine/dsa.py): per query the index_topk earlier keys
with the highest relu(q_i . k_i)-weighted scores; indexer_types "shared" layers reuse the previous "full" layer's
picks. MLP layers dense or sparse by mlp_layer_types (default: the first first_k_dense_replace dense), shared
experts and GLM-4 MoE's routing (sigmoid + e_score_correction_bias, top-2 group scores, renormalised x
routed_scaling_factor). The MTP layer past num_hidden_layers is not read, as HF ignores it."""

from __future__ import annotations

from freetoken.models import deepseek
from freetoken.models.config import DSA, CheckpointError, ConfigReader, ModelConfig, Routing
from freetoken.models.family import ATTN, Family

INDEXER_TYPES = ("full", "shared")
MLP_TYPES = ("dense", "sparse")


def _types(c: ConfigReader, name: str, allowed: tuple[str, ...], layers: int, default: list[str]) -> list[str]:
    types = c.get(name, default=default)
    if not isinstance(types, list) or len(types) != layers or any(t not in allowed for t in types):
        raise CheckpointError(f"{c.path}: {name} must list one of {', '.join(allowed)} per layer ({layers}), "
                              f"got {types!r}")
    return types


# one layer kind under two names: transformers 5.17 writes the first into config.json, later releases the second
DSA_LAYER_NAMES = ("deepseek_sparse_attention", "indexed_attention")


def read_config(c: ConfigReader) -> ModelConfig:
    layers = c.get("num_hidden_layers", kind=int)
    first_dense = min(c.get("first_k_dense_replace", default=3, kind=int), layers)
    mlp = _types(c, "mlp_layer_types", MLP_TYPES, layers, ["dense"] * first_dense + ["sparse"] * (layers - first_dense))
    indexers = _types(c, "indexer_types", INDEXER_TYPES, layers, ["full"] * layers)
    kinds = c.get("layer_types", default=None)
    if kinds is not None and any(k not in DSA_LAYER_NAMES for k in kinds):
        raise CheckpointError(f"{c.path}: layer_types {kinds!r}: only {' / '.join(map(repr, DSA_LAYER_NAMES))} "
                              "layers are supported")
    mla = deepseek._mla(c, interleave=True)
    if not mla.q_lora_rank:
        raise CheckpointError(f"{c.path}: q_lora_rank must be positive (the indexer reads the q LoRA residual)")
    common = c.common("glm_moe_dsa")
    common.update(num_kv_heads=common["num_heads"], head_dim=max(mla.qk_head_dim, mla.v_head_dim))
    moe_intermediate = c.get("moe_intermediate_size", kind=int)
    return ModelConfig(
        **common,
        num_experts=c.get("n_routed_experts", "num_local_experts", kind=int),
        expert_intermediate=moe_intermediate,
        norm_topk_prob=bool(c.get("norm_topk_prob", default=True)),
        moe_layers=tuple(l for l, t in enumerate(mlp) if t == "sparse"),
        dense_intermediate=c.get("intermediate_size", default=0, kind=int),
        shared_expert_intermediate=c.get("n_shared_experts", default=1, kind=int) * moe_intermediate,
        attention_bias=bool(c.get("attention_bias", default=False)),
        rope_yarn=c.yarn(),
        mla=mla,
        routing=Routing(score="sigmoid", n_group=max(c.get("n_group", default=1, kind=int), 1),
                        topk_group=max(c.get("topk_group", default=1, kind=int), 1), group_score="top2",
                        scale=c.get("routed_scaling_factor", default=1.0, kind=float), correction_bias=True,
                        fp32=True),
        dsa=DSA(index_topk=c.get("index_topk", kind=int), index_heads=c.get("index_n_heads", kind=int),
                index_head_dim=c.get("index_head_dim", kind=int),
                indexer_layers=tuple(l for l, t in enumerate(indexers) if t == "full")),
    )


def attention_tensors(cfg: ModelConfig, layer: int) -> dict[str, tuple[int, ...]]:
    """MLA's tensors (deepseek.py; GLM-5's o_proj and kv_a biases follow attention_bias, q_b / kv_b have none),
    plus the indexer's on its own indexer layers."""
    out = deepseek.attention_tensors(cfg, layer)
    d, i = cfg.dsa, ATTN.format(l=layer) + "indexer."
    if layer in d.indexer_layers:
        out.update({i + "wq_b.weight": (d.index_heads * d.index_head_dim, cfg.mla.q_lora_rank),
                    i + "wk.weight": (d.index_head_dim, cfg.hidden_size), i + "k_norm.weight": (d.index_head_dim,),
                    i + "k_norm.bias": (d.index_head_dim,),
                    i + "weights_proj.weight": (d.index_heads, cfg.hidden_size)})
    return out


FAMILY = Family("glm_moe_dsa", ("GlmMoeDsaForCausalLM",), read_config, shared_expert="shared_experts.",
                attention=attention_tensors)
