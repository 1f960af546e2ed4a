"""A model card from a local HF checkpoint's config.json: the shape fields the engine's loader reads, parameter
counts from the tensor shapes it will load, the expert format from quantization_config. Only config.json is read,
so a directory holding just that file is enough for `ft predict --model DIR`."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from freetoken.quant import describe, load_quant_format
from freetoken.sim.model_card import ModelCard

# config.json "dtype" (transformers >= 4.56) or "torch_dtype" -> bits of the dense weights, KV cache and, when not
# quantized, the experts
DTYPE_BITS = {"float32": 32.0, "bfloat16": 16.0, "float16": 16.0}
EMBEDDING = "model.embed_tokens.weight"


def card_from_checkpoint(path: str | Path) -> ModelCard:
    from freetoken.models.checkpoint import read_config

    path = Path(path)
    family, cfg = read_config(path)
    config_file = path / "config.json"
    raw = json.loads(config_file.read_text())
    dtype = raw.get("dtype") or raw.get("torch_dtype") or "bfloat16"
    if dtype not in DTYPE_BITS:
        raise ValueError(f"{config_file}: dtype {dtype!r} is not one of {', '.join(DTYPE_BITS)}")
    bits = DTYPE_BITS[dtype]
    fmt = load_quant_format(path)
    shapes = {name: shape for name, shape in family.dense_tensors(cfg).items()  # every non-expert weight
              if not family.integer_tensor(name)}  # (not a hash layer's token -> experts table)
    embedding = math.prod(shapes[EMBEDDING])
    dense = sum(math.prod(s) for s in shapes.values()) - embedding
    if cfg.tie_word_embeddings:  # the table is also the lm_head: read whole every token
        dense, embedding = dense + embedding, 0
    D, I, E = cfg.hidden_size, cfg.expert_intermediate, cfg.num_experts
    keys = cfg.num_moe_layers * E
    expert_params = 3 * D * I
    dense_b, embedding_b = dense / 1e9, embedding / 1e9
    card = ModelCard(
        name=path.resolve().name, hf_id=str(raw.get("_name_or_path") or path.resolve().name),
        num_layers=cfg.num_layers, moe_layers=cfg.num_moe_layers, num_experts=E, top_k=cfg.top_k,
        shared_experts=1 if cfg.shared_expert_intermediate else 0, hidden_size=D, expert_intermediate_size=I,
        dense_params=dense_b, embedding_params=embedding_b,
        kv_bytes_per_token=2 * len(cfg.attention_layers) * cfg.num_kv_heads * cfg.head_dim * int(bits) // 8,
        attention_layers=len(cfg.attention_layers), attention_width=cfg.num_heads * cfg.head_dim,
        state_bytes_per_sequence=cfg.state_bytes(int(bits) // 8), kv_head_dim=cfg.head_dim, kv_bits=bits,
        expert_bits=bits, dense_bits=bits,
        total_params=dense_b + embedding_b + keys * expert_params / 1e9,
        active_params=dense_b + embedding_b + cfg.num_moe_layers * cfg.top_k * expert_params / 1e9,
        source=f"{config_file} ({cfg.architecture}, {dtype}"
               + (f", experts {describe(fmt.expert_format)})" if fmt else ")"),
        max_context=cfg.max_position_embeddings,
        expert_format=fmt.expert_format if fmt else None, expert_bias_params=2 * I + D if cfg.expert_bias else 0,
        **_linear_fields(cfg))
    if cfg.v4 is not None:  # one key = value row per layer and the compressed entries (engine/v4_kv.py)
        values = cfg.v4.kv_values_per_token(cfg.num_layers, cfg.head_dim)
        return replace(card, kv_bytes_per_token=math.ceil(values * bits / 8))
    if cfg.dsa is None:
        return card
    return replace(card, kv_bytes_per_token=card.kv_bytes_per_token + cfg.index_key_values() * int(bits) // 8)


def _linear_fields(cfg) -> dict:
    """The Gated DeltaNet layers' shape the cost model charges FLOPs for (ModelCard.linear_flops_per_token)."""
    lin = cfg.linear_attention
    if lin is None:
        return {}
    return dict(linear_layers=len(lin.layers), linear_heads=lin.num_v_heads, linear_key_head_dim=lin.k_head_dim,
                linear_value_head_dim=lin.v_head_dim)
