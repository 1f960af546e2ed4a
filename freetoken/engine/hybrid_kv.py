"""The per-sequence cache of a hybrid model: KV for the full-attention layers, and for each Gated DeltaNet layer a
conv state [conv_dim, K - 1] and a recurrent state [Hv, Dk, Dv] (fp32) beside it. The states cannot be cut back
(state_kv.StatefulKV): a shorter prefix restarts from a snapshot or from zero.
"""

from __future__ import annotations

import torch

from freetoken.engine.state_kv import StatefulKV
from freetoken.models.config import ModelConfig


class HybridKV(StatefulKV):
    def __init__(self, cfg: ModelConfig, max_tokens: int, dtype: torch.dtype, device: torch.device | str,
                 kv_dtype: str = "auto"):
        """kv_dtype: of the full-attention layers' K/V (the conv and recurrent states keep theirs)."""
        la = cfg.linear_attention
        super().__init__(cfg.num_layers, max_tokens, cfg.num_kv_heads, cfg.head_dim, dtype, device,
                         kv_layers=cfg.attention_layers, kv_dtype=kv_dtype)
        self.conv = {l: torch.zeros((la.conv_dim, la.conv_kernel - 1), dtype=dtype, device=device) for l in la.layers}
        self.state = {l: torch.zeros((la.num_v_heads, la.k_head_dim, la.v_head_dim), dtype=torch.float32,
                                     device=device) for l in la.layers}
        self.keep_states({**{f"conv{l}": t for l, t in self.conv.items()},
                          **{f"state{l}": t for l, t in self.state.items()}})
