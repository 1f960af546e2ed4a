"""The random-weight models the GPU benchmarks decode: Qwen3-MoE checkpoints of a given shape built directly in
memory (no HF, no disk), experts pinned on CUDA; by default every MoE layer shares one host expert tensor, so the
host holds one layer's experts, not all of them (copies and CPU-lane reads still move real bytes)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True, slots=True)
class Shape:
    layers: int
    experts: int
    top_k: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


QWEN3_30B_A3B = Shape(48, 128, 8, 2048, 768, 32, 4, 128, 151936)
TINY = Shape(2, 8, 2, 64, 32, 4, 2, 16, 128)


def random_checkpoint(shape: Shape, dtype: torch.dtype, device: str, distinct_layers: bool = False):
    from freetoken.models import FAMILIES
    from freetoken.models.checkpoint import Checkpoint
    from freetoken.models.config import ModelConfig

    s = shape
    cfg = ModelConfig(family="qwen3_moe", architecture="Qwen3MoeForCausalLM", vocab_size=s.vocab,
                      hidden_size=s.hidden, num_layers=s.layers, num_heads=s.heads, num_kv_heads=s.kv_heads,
                      head_dim=s.head_dim, rope_theta=1e6, rms_norm_eps=1e-6, num_experts=s.experts,
                      top_k=s.top_k, expert_intermediate=s.intermediate, norm_topk_prob=True,
                      moe_layers=tuple(range(s.layers)), qk_norm="head", max_position_embeddings=4096)
    family = FAMILIES["qwen3_moe"]
    g = torch.Generator(device=device).manual_seed(0)
    dense = {}
    for name, dims in family.dense_tensors(cfg).items():
        if len(dims) == 1:
            dense[name] = torch.ones(dims, dtype=dtype, device=device)
        else:  # 1/sqrt(fan_in): activations keep their scale through 48 layers
            dense[name] = (torch.randn(dims, generator=g, device=device) / dims[-1] ** 0.5).to(dtype)
    pin = torch.cuda.is_available()
    E, I, D = s.experts, s.intermediate, s.hidden

    def layer_experts():
        gu = torch.empty((E, 2 * I, D), dtype=dtype, pin_memory=pin)
        down = torch.empty((E, D, I), dtype=dtype, pin_memory=pin)
        gu.copy_(torch.randn((E, 2 * I, D), generator=g, device=device) / D ** 0.5)
        down.copy_(torch.randn((E, D, I), generator=g, device=device) / I ** 0.5)
        return gu, down

    shared = None if distinct_layers else layer_experts()
    experts = [layer_experts() if distinct_layers else shared for _ in range(s.layers)]
    return Checkpoint(Path("<random>"), family, cfg, dense, experts)


def free_device_memory() -> None:
    """Give back a finished engine's device memory before the next is built (a resident one holds every expert); on a
    CPU dry run there is none, and a full collection over torch's and the engine's objects costs ~80 ms a call."""
    import gc

    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()
