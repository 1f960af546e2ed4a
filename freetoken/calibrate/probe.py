"""End-to-end decode probe: the live engine decoding the same tokens with offload and with hybrid, so a hybrid
recommendation rests on measured decode speed, not only on lane bandwidths.

The model is synthetic (random weights, Qwen3-MoE layout) at a real expert geometry with a cache of a quarter of
the experts: random routing misses often, which is the regime the split decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from freetoken.calibrate.lanes import Geometry


@dataclass(frozen=True, slots=True)
class ProbeModel:
    geometry: Geometry = Geometry()
    layers: int = 4
    experts: int = 64
    top_k: int = 8
    fraction: float = 0.25  # of all experts resident
    tokens: int = 24  # decoded per mode, after a short warm-up

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.experts or self.layers <= 0 or self.tokens <= 0:
            raise ValueError(f"probe model: need 0 < top_k <= experts and positive layers/tokens, got {self}")


def synthetic_checkpoint(m: ProbeModel, pin: bool, seed: int = 0):
    """A Checkpoint built in memory (no files): random dense weights, random experts."""
    from freetoken.models import read_model_config
    from freetoken.models.checkpoint import Checkpoint

    g = m.geometry
    heads = max(1, g.hidden // 128)
    raw = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": g.hidden, "num_hidden_layers": m.layers,
           "num_attention_heads": heads, "num_key_value_heads": max(1, heads // 4), "head_dim": min(128, g.hidden),
           "vocab_size": 512, "num_experts": m.experts, "num_experts_per_tok": m.top_k,
           "moe_intermediate_size": g.intermediate, "max_position_embeddings": 4096, "norm_topk_prob": True}
    family, cfg = read_model_config(raw, "<synthetic probe model>")
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).to(g.dtype)

    dense = {name: (torch.ones(shape, dtype=g.dtype) if name.endswith("norm.weight") else rand(*shape))
             for name, shape in family.dense_tensors(cfg).items()}
    E, I, D = m.experts, g.intermediate, g.hidden
    experts = []
    for _ in cfg.moe_layers:
        gate_up, down = rand(E, 2 * I, D), rand(E, D, I)  # [E, 2I, D], [E, D, I]
        experts.append((gate_up.pin_memory(), down.pin_memory()) if pin else (gate_up, down))
    return Checkpoint(Path("<synthetic>"), family, cfg, dense, experts)


def decode_probe(bp_gb_s: float, bh_gb_s: float, model: ProbeModel | None = None, device: str | None = None,
                 kernels: str | None = None) -> dict:
    """Greedy decode of the same prompt under offload and under hybrid (balanced at bp, bh)."""
    from freetoken.engine import CacheConfig, Engine, SamplingParams
    from freetoken.placement import Split

    m = model or ProbeModel()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    kernels = kernels or ("triton" if device == "cuda" else "reference")
    ckpt = synthetic_checkpoint(m, pin=device == "cuda")
    prompt = list(range(1, 17))
    out = {"model": f"synthetic qwen3_moe {m.layers}x{m.experts} experts {m.geometry.hidden}x"
                    f"{m.geometry.intermediate} {m.geometry.fmt}, top-{m.top_k}, {m.fraction:.0%} resident",
           "tokens": m.tokens}
    runs = {}
    for mode, split in (("offload", Split("offload")), ("hybrid", Split("hybrid", "balanced", bp_gb_s, bh_gb_s))):
        engine = Engine(ckpt, CacheConfig("lru", fraction=m.fraction, split=split), kernels=kernels, device=device,
                        max_context=256, record=False)
        list(engine.generate(prompt, SamplingParams(greedy=True), max_tokens=2, stop_token_ids=()))  # warm-up
        engine.reset()
        tokens = list(engine.generate(prompt, SamplingParams(greedy=True), max_tokens=m.tokens, stop_token_ids=()))
        c = engine.counters
        runs[mode] = tokens
        out[f"{mode}_tok_s"] = round(engine.stats.decode_tok_s, 3)
        out[f"{mode}_counters"] = {"hits": c.hits, "fetched": c.fetched, "cpu": c.cpu}
        del engine
    out["same_tokens"] = runs["offload"] == runs["hybrid"]
    return out
