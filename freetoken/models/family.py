"""An architecture family: how its config.json and tensor names map onto the shared decoder blocks.

Every family here is a Llama-like decoder (RMSNorm, GQA attention with rope, a routed SwiGLU MoE block); a family
file says only where its tensors live and which config fields it reads. Tensor names are format strings with {l}
(decoder layer), {e} (expert) and {p} (one of the expert's three projections).

Fused expert layouts (EXPERT_LAYOUTS): "rows", gate_up [E, 2I, D] (gate rows, then up rows) and down [E, D, I];
"gpt_oss", gate_up [E, D, 2I] (x @ W, gate and up columns interleaved: gate = even), down [E, I, D], biases
gate_up [E, 2I] interleaved the same way and down [E, D].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from freetoken.models.config import ConfigReader, ModelConfig

ATTN = "model.layers.{l}.self_attn."
EXPERT_LAYOUTS = ("rows", "gpt_oss")


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    architectures: tuple[str, ...]  # config.json "architectures" values this family loads
    read_config: Callable[[ConfigReader], ModelConfig]
    moe_prefix: str = "model.layers.{l}.mlp."
    router: str = "gate.weight"  # under moe_prefix
    router_bias: str = "gate.bias"  # under moe_prefix, where the config has router_bias
    expert: str = "experts.{e}.{p}.weight"  # under moe_prefix, per-expert layout
    expert_proj: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")  # gate, up, down
    fused_experts: tuple[str, str] = ("experts.gate_up_proj", "experts.down_proj")  # in expert_layout
    expert_layout: str = "rows"
    expert_biases: tuple[str, str] = ("experts.gate_up_proj_bias", "experts.down_proj_bias")  # with expert_bias
    dense_prefix: str = "model.layers.{l}.mlp."  # dense MLP of non-MoE layers: gate_proj / up_proj / down_proj
    shared_expert: str = "shared_expert."  # under moe_prefix: gate_proj / up_proj / down_proj
    shared_expert_gate: str = "shared_expert_gate.weight"  # under moe_prefix: [1, D]
    q_norm: str = ATTN + "q_norm.weight"
    k_norm: str = ATTN + "k_norm.weight"
    sinks: str = ATTN + "sinks"
    correction_bias: str = "gate.e_score_correction_bias"  # under moe_prefix, with routing.correction_bias
    attention: Callable[[ModelConfig, int], dict[str, tuple[int, ...]]] | None = None  # a layer's attention tensors
    # where they are not q/k/v/o (DeepSeek's MLA)
    linear_attention: Callable[[ModelConfig, int], dict[str, tuple[int, ...]]] | None = None  # a Gated DeltaNet
    # layer's tensors (config.linear_attention)
    text_prefix: str = ""  # multimodal checkpoints: "model." names are stored under "model.<text_prefix>"
    skip_prefixes: tuple[str, ...] = ()  # tensors of other modalities, not loaded (said at load)
    skip_reason: str = "served text-only"  # why, in the note
    canonical: Callable[[str], str] | None = None  # a stored tensor name -> ours, where checkpoints name it otherwise

    def __post_init__(self) -> None:
        if self.expert_layout not in EXPERT_LAYOUTS:
            raise ValueError(f"family {self.name}: expert_layout {self.expert_layout!r} not in {EXPERT_LAYOUTS}")

    def dense_tensors(self, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """Every non-expert tensor the model needs -> its shape (the device-resident part)."""
        D = cfg.hidden_size
        out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, D),
                                           "model.norm.weight": (D,)}
        if not cfg.tie_word_embeddings:
            out["lm_head.weight"] = (cfg.vocab_size, D)
        for l in range(cfg.num_layers):
            out[f"model.layers.{l}.input_layernorm.weight"] = (D,)
            out[f"model.layers.{l}.post_attention_layernorm.weight"] = (D,)
            if cfg.is_linear(l):
                out.update(self.linear_attention(cfg, l))
            else:
                out.update(self._attention_tensors(cfg, l))
            if cfg.moe_index(l) >= 0:
                m = self.moe_prefix.format(l=l)
                out[m + self.router] = (cfg.num_experts, D)
                if cfg.router_bias:
                    out[m + self.router_bias] = (cfg.num_experts,)
                if cfg.routing.correction_bias:
                    out[m + self.correction_bias] = (cfg.num_experts,)
                if cfg.shared_expert_intermediate:
                    out.update(_mlp(m + self.shared_expert, cfg.shared_expert_intermediate, D))
                if cfg.shared_expert_gate:
                    out[m + self.shared_expert_gate] = (1, D)
            else:
                out.update(_mlp(self.dense_prefix.format(l=l), cfg.dense_intermediate, D))
        return out

    def _attention_tensors(self, cfg: ModelConfig, l: int) -> dict[str, tuple[int, ...]]:
        """One attention layer's tensors (q/k/v/o, or the family's `attention` hook) -> shapes."""
        D, H, Hkv, Dh, a = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, ATTN.format(l=l)
        out: dict[str, tuple[int, ...]] = {}
        if self.attention is not None:
            out.update(self.attention(cfg, l))
        else:
            q_rows = H * Dh * (2 if cfg.attention_output_gate else 1)  # per head: q rows, then its gate's rows
            for proj, rows in (("q_proj", q_rows), ("k_proj", Hkv * Dh), ("v_proj", Hkv * Dh)):
                out[a + proj + ".weight"] = (rows, D)
                if cfg.attention_bias:
                    out[a + proj + ".bias"] = (rows,)
            out[a + "o_proj.weight"] = (D, H * Dh)
        if cfg.o_proj_bias:
            out[a + "o_proj.bias"] = (D,)
        if cfg.attention_sinks:
            out[self.sinks.format(l=l)] = (H,)
        if cfg.qk_norm == "head":
            out[self.q_norm.format(l=l)] = (Dh,)
            out[self.k_norm.format(l=l)] = (Dh,)
        elif cfg.qk_norm == "full":
            out[self.q_norm.format(l=l)] = (H * Dh,)
            out[self.k_norm.format(l=l)] = (Hkv * Dh,)
        return out

    def integer_tensor(self, name: str) -> bool:
        """Is a dense tensor an integer table (not weights: never cast to the compute dtype)?"""
        return False

    def mlp_tensors(self, prefix: str) -> tuple[str, str, str]:
        return prefix + "gate_proj.weight", prefix + "up_proj.weight", prefix + "down_proj.weight"

    def expert_tensor(self, layer: int, expert: int, which: int) -> str:
        """which: 0 gate [I, D], 1 up [I, D], 2 down [D, I]."""
        return self.moe_prefix.format(l=layer) + self.expert.format(e=expert, p=self.expert_proj[which])

    def fused_tensor(self, layer: int, which: int) -> str:
        """which: 0 gate_up, 1 down (shapes by expert_layout)."""
        return self.moe_prefix.format(l=layer) + self.fused_experts[which]

    def fused_shapes(self, cfg: ModelConfig) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        E, I, D = cfg.num_experts, cfg.expert_intermediate, cfg.hidden_size
        return ((E, D, 2 * I), (E, I, D)) if self.expert_layout == "gpt_oss" else ((E, 2 * I, D), (E, D, I))

    def bias_tensor(self, layer: int, which: int) -> str:
        """which: 0 gate_up [E, 2I], 1 down [E, D]."""
        return self.moe_prefix.format(l=layer) + self.expert_biases[which]


def _mlp(prefix: str, F: int, D: int) -> dict[str, tuple[int, int]]:
    """A SwiGLU MLP's tensors (dense layers, shared experts)."""
    return {prefix + "gate_proj.weight": (F, D), prefix + "up_proj.weight": (F, D), prefix + "down_proj.weight": (D, F)}
