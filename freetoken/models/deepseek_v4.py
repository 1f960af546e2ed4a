"""DeepSeek-V4 (DeepseekV4ForCausalLM: V4-Flash, V4-Pro) as transformers' deepseek_v4 defines it.

Attention (engine/v4_attention.py): q through a LoRA pair (wq_a, q_norm, wq_b) and a per-head RMSNorm without weight,
one shared key = value head (wkv, norm), rope on the trailing qk_rope_head_dim dims of each head (interleaved pairs),
a learned sink per head, each query over the last sliding_window tokens; "compressed_sparse_attention" layers add
compressed entries (one per 4 tokens, overlapping windows) of which a lightning indexer picks index_topk per query,
"heavily_compressed_attention" layers one entry per 128 tokens, all visible; the output's rope dims turned back by
the query's angle, then a grouped output projection (wo_a per head group, wo_b). Sliding layers use rope_theta, the
compressed ones compress_rope_theta (YaRN with attention factor 1 where configured).
Residual: hc_mult streams and manifold-constrained hyper-connections around both blocks (kernels/hyper_connection.py).
MoE on every layer: sqrt(softplus) scores, the first hash layers pick by a token-id table (tid2eid), the others by
top-k of score + correction bias; weights renormalised x routed_scaling_factor; experts and the shared expert with
silu(min(gate, limit)) * clamp(up, +-limit) (swiglu_limit).

Tensor names: as transformers' save_pretrained writes them (model.layers.N.attn.wq_a.weight, ...); the published
checkpoints' (layers.N.attn.wq_a.weight, embed.weight, hc_head_fn, ..., FP8 scales under `.scale`) are read too.
The multi-token-prediction layer (mtp.) is not loaded, as transformers skips it.
"""

from __future__ import annotations

import re

from freetoken.models.config import CheckpointError, ConfigReader, ModelConfig, Routing, YarnRope
from freetoken.models.config_v4 import V4Layout
from freetoken.models.family import Family

LAYER = "model.layers.{l}."
ATTN = LAYER + "attn."
FFN = LAYER + "ffn."
LAYER_TYPES = {"sliding_attention": "sliding", "compressed_sparse_attention": "csa",
               "heavily_compressed_attention": "hca"}
RATIO_TYPES = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
MLP_TYPES = ("hash_moe", "moe")
HEAD = {"model.embed_tokens.weight": "embed.weight", "model.hc_head.hc_fn": "hc_head_fn",
        "model.hc_head.hc_base": "hc_head_base", "model.hc_head.hc_scale": "hc_head_scale"}
OURS = {stored: ours for ours, stored in HEAD.items()}


def _list(c: ConfigReader, name: str, layers: int, allowed) -> list | None:
    value = c.raw.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != layers or any(v not in allowed for v in value):
        raise CheckpointError(f"{c.path}: {name} must list one of {', '.join(map(str, allowed))} per layer "
                              f"({layers}), got {value!r}")
    return value


def _kinds(c: ConfigReader, layers: int) -> tuple[str, ...]:
    """layer_types, else the older compress_ratios (0 / 4 / 128 per layer), else transformers' default (two heavily
    compressed layers, then compressed sparse and heavily compressed alternating)."""
    types = _list(c, "layer_types", layers, tuple(LAYER_TYPES))
    if types is None:
        ratios = _list(c, "compress_ratios", layers, tuple(RATIO_TYPES))
        types = [RATIO_TYPES[r] for r in ratios] if ratios is not None else \
            ["heavily_compressed_attention"] * min(layers, 2) + \
            ["compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(layers - 2)]
    return tuple(LAYER_TYPES[t] for t in types)


def _rates(c: ConfigReader) -> tuple[int, int]:
    rates = c.raw.get("compress_rates")
    if rates is not None and not isinstance(rates, dict):
        raise CheckpointError(f"{c.path}: compress_rates must map layer types to rates, got {rates!r}")
    sub = ConfigReader(rates or {}, f"{c.path} compress_rates")
    csa = sub.get("compressed_sparse_attention", default=c.get("compress_rate_csa", default=4, kind=int), kind=int)
    hca = sub.get("heavily_compressed_attention", default=c.get("compress_rate_hca", default=128, kind=int), kind=int)
    if csa <= 0 or hca <= 0:
        raise CheckpointError(f"{c.path}: compress_rates must be positive, got {csa} (compressed_sparse_attention) "
                              f"and {hca} (heavily_compressed_attention)")
    return csa, hca


def _ropes(c: ConfigReader, rope_dim: int) -> tuple[float, float, YarnRope | None]:
    """(main theta, compress theta, the compressed layers' YaRN or None) from rope_parameters as transformers nests
    it ({"main": ..., "compress": ...}) or flat (YaRN fields for the compressed layers)."""
    params = c.raw.get("rope_parameters") or c.raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise CheckpointError(f"{c.path}: rope_parameters must be an object, got {params!r}")
    if isinstance(params.get("main"), dict) and isinstance(params.get("compress"), dict):
        main, compress = params["main"], params["compress"]
    else:
        main = {"rope_type": "default", "rope_theta": c.get("rope_theta", default=10000.0, kind=float)}
        compress = {**{k: v for k, v in params.items() if k not in ("main", "compress")},
                    "rope_theta": c.get("compress_rope_theta", default=160000.0, kind=float)}
    main_r = ConfigReader(main, f"{c.path} rope_parameters.main")
    if main_r.get("rope_type", default="default") != "default":
        raise CheckpointError(f"{c.path}: rope_parameters.main rope_type {main['rope_type']!r}: only the default "
                              "rope is supported on sliding layers")
    comp = ConfigReader(compress, f"{c.path} rope_parameters.compress")
    kind = comp.get("rope_type", "type", default="default")
    if kind not in ("default", "yarn"):
        raise CheckpointError(f"{c.path}: rope_parameters.compress rope_type {kind!r} is not one of default, yarn")
    yarn = None
    if kind == "yarn":
        yarn = YarnRope(comp.get("factor", kind=float), comp.get("original_max_position_embeddings", kind=int),
                        comp.get("beta_fast", default=32.0, kind=float), comp.get("beta_slow", default=1.0, kind=float),
                        bool(comp.get("truncate", default=True)),
                        comp.get("attention_factor", default=1.0, kind=float))  # V4: cos / sin unscaled
    return (main_r.get("rope_theta", default=c.get("rope_theta", default=10000.0, kind=float), kind=float),
            comp.get("rope_theta", kind=float), yarn)


def read_config(c: ConfigReader) -> ModelConfig:
    layers = c.get("num_hidden_layers", kind=int)
    common = c.common("deepseek_v4")
    head_dim = c.get("head_dim", default=512, kind=int)
    factor = c.get("partial_rotary_factor", default=None, kind=float)  # transformers: else qk_rope_head_dim / head_dim,
    rope_dim = int(head_dim * factor) if factor is not None else \
        c.get("qk_rope_head_dim", default=int(head_dim * 64 / 512), kind=int)  # else 64 / 512 of the head
    main_theta, compress_theta, yarn = _ropes(c, rope_dim)
    csa, hca = _rates(c)
    mlp = _list(c, "mlp_layer_types", layers, MLP_TYPES)
    if mlp is None:
        mlp = ["hash_moe"] * min(layers, c.get("num_hash_layers", default=3, kind=int)) + ["moe"] * layers
    if c.get("scoring_func", default="sqrtsoftplus") != "sqrtsoftplus":
        raise CheckpointError(f"{c.path}: scoring_func {c.raw['scoring_func']!r} is not supported (sqrtsoftplus)")
    if c.get("hidden_act", default="silu") != "silu":
        raise CheckpointError(f"{c.path}: hidden_act {c.raw['hidden_act']!r} is not supported (silu)")
    layout = V4Layout(
        q_lora_rank=c.get("q_lora_rank", kind=int), rope_dim=rope_dim, window=c.get("sliding_window", kind=int),
        o_groups=c.get("o_groups", kind=int), o_lora_rank=c.get("o_lora_rank", kind=int), kinds=_kinds(c, layers),
        csa_rate=csa, hca_rate=hca, index_heads=c.get("index_n_heads", kind=int),
        index_head_dim=c.get("index_head_dim", kind=int), index_topk=c.get("index_topk", kind=int),
        compress_rope_theta=compress_theta, compress_yarn=yarn, hc_mult=c.get("hc_mult", kind=int),
        hc_iters=c.get("hc_sinkhorn_iters", default=20, kind=int), hc_eps=c.get("hc_eps", default=1e-6, kind=float),
        hash_layers=tuple(l for l, t in enumerate(mlp[:layers]) if t == "hash_moe"))
    if rope_dim % 2 or rope_dim > head_dim:
        raise CheckpointError(f"{c.path}: partial_rotary_factor x head_dim gives {rope_dim} rope dims, which must be "
                              f"even and within head_dim {head_dim}")
    heads = common["num_heads"]
    if heads % layout.o_groups:
        raise CheckpointError(f"{c.path}: num_attention_heads {heads} is not a multiple of o_groups "
                              f"{layout.o_groups}")
    if c.get("num_key_value_heads", default=1, kind=int) != 1:
        raise CheckpointError(f"{c.path}: num_key_value_heads must be 1 (DeepSeek-V4 shares one key = value head), "
                              f"got {c.raw['num_key_value_heads']}")
    moe = c.get("moe_intermediate_size", kind=int)
    limit = c.get("swiglu_limit", default=10.0, kind=float)
    common.update(num_kv_heads=1, head_dim=head_dim, rope_theta=main_theta)
    return ModelConfig(
        **common,
        num_experts=c.get("n_routed_experts", "num_local_experts", kind=int),
        expert_intermediate=moe,
        norm_topk_prob=True,  # transformers' routers always renormalise
        moe_layers=tuple(range(layers)),
        shared_expert_intermediate=c.get("n_shared_experts", default=1, kind=int) * moe,
        expert_glu="silu_limit",
        glu_limit=limit,
        sliding_window=layout.window,
        sliding_layers=tuple(range(layers)),
        routing=Routing(score="sqrtsoftplus", scale=c.get("routed_scaling_factor", default=1.5, kind=float),
                        correction_bias=True),
        rotary_dim=rope_dim,
        v4=layout,
    )


def _mlp(prefix: str, F: int, D: int) -> dict[str, tuple[int, ...]]:
    return {prefix + "w1.weight": (F, D), prefix + "w3.weight": (F, D), prefix + "w2.weight": (D, F)}


def _compressor(prefix: str, rate: int, width: int, pairs: int, D: int) -> dict[str, tuple[int, ...]]:
    """A compressor's tensors: kv and gate projections of `pairs` x width channels, position bias, the norm."""
    return {prefix + "wkv.weight": (pairs * width, D), prefix + "wgate.weight": (pairs * width, D),
            prefix + "ape": (rate, pairs * width), prefix + "norm.weight": (width,)}


class V4Family(Family):
    """DeepSeek-V4's tensors differ from the Llama-like layout everywhere: its own dense_tensors."""

    __slots__ = ()

    def dense_tensors(self, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        v, D, H, Dh, N = cfg.v4, cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.v4.hc_mult
        M = (2 + N) * N
        out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, D), "model.norm.weight": (D,),
                                           "model.hc_head.hc_fn": (N, N * D), "model.hc_head.hc_base": (N,),
                                           "model.hc_head.hc_scale": (1,)}
        if not cfg.tie_word_embeddings:
            out["head.weight"] = (cfg.vocab_size, D)
        for l in range(cfg.num_layers):
            p, a, f = LAYER.format(l=l), ATTN.format(l=l), FFN.format(l=l)
            out.update({p + "attn_norm.weight": (D,), p + "ffn_norm.weight": (D,)})
            for block in ("attn", "ffn"):
                out.update({f"{p}hc_{block}_fn": (M, N * D), f"{p}hc_{block}_base": (M,), f"{p}hc_{block}_scale": (3,)})
            out.update({a + "attn_sink": (H,), a + "wq_a.weight": (v.q_lora_rank, D),
                        a + "q_norm.weight": (v.q_lora_rank,), a + "wq_b.weight": (H * Dh, v.q_lora_rank),
                        a + "wkv.weight": (Dh, D), a + "norm.weight": (Dh,),
                        a + "wo_a.weight": (v.o_groups * v.o_lora_rank, H * Dh // v.o_groups),
                        a + "wo_b.weight": (D, v.o_groups * v.o_lora_rank)})
            kind = v.kinds[l]
            if kind == "csa":
                out.update(_compressor(a + "compressor.", v.csa_rate, Dh, 2, D))
                out.update(_compressor(a + "indexer.compressor.", v.csa_rate, v.index_head_dim, 2, D))
                out.update({a + "indexer.weights_proj.weight": (v.index_heads, D),
                            a + "indexer.wq_b.weight": (v.index_heads * v.index_head_dim, v.q_lora_rank)})
            elif kind == "hca":
                out.update(_compressor(a + "compressor.", v.hca_rate, Dh, 1, D))
            out[f + "gate.weight"] = (cfg.num_experts, D)
            out[f + ("gate.tid2eid" if l in v.hash_layers else "gate.bias")] = \
                (cfg.vocab_size, cfg.top_k) if l in v.hash_layers else (cfg.num_experts,)
            if cfg.shared_expert_intermediate:
                out.update(_mlp(f + "shared_experts.", cfg.shared_expert_intermediate, D))
        return out

    def integer_tensor(self, name: str) -> bool:
        return name.endswith(".tid2eid")


_PUBLISHED_LAYER = re.compile(r"^layers\.\d+\.")


def canonical(stored: str) -> str:
    """A stored tensor name -> ours: the published checkpoints drop the `model.` prefix and name the embedding and
    the final hyper-connection head their own way."""
    if stored in OURS:
        return OURS[stored]
    if stored == "norm.weight" or _PUBLISHED_LAYER.match(stored):
        return "model." + stored
    return stored


FAMILY = V4Family("deepseek_v4", ("DeepseekV4ForCausalLM",), read_config, moe_prefix=FFN,
                  expert="experts.{e}.{p}.weight", expert_proj=("w1", "w3", "w2"), correction_bias="gate.bias",
                  shared_expert="shared_experts.", skip_prefixes=("mtp.",),
                  skip_reason="runs without its multi-token-prediction layer, as transformers does",
                  canonical=canonical)
