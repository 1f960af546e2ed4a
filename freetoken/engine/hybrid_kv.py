"""The per-sequence cache of a hybrid model: KV for the full-attention layers, and for each Gated DeltaNet layer a
conv state [conv_dim, K - 1] and a recurrent state [Hv, Dk, Dv] (fp32) beside it.

A recurrent state summarises every token so far: unlike KV it cannot be cut back to an earlier length. So a reuse
of a shorter prefix restarts from a snapshot taken at that length (snapshot()), or from zero.
"""

from __future__ import annotations

import torch

from freetoken.engine.kv import KVCache
from freetoken.models.config import ModelConfig


class HybridKV(KVCache):
    def __init__(self, cfg: ModelConfig, max_tokens: int, dtype: torch.dtype, device: torch.device | str,
                 kv_dtype: str = "auto"):
        """kv_dtype: of the full-attention layers' K/V (the conv and recurrent states keep theirs)."""
        la = cfg.linear_attention
        super().__init__(cfg.num_layers, max_tokens, cfg.num_kv_heads, cfg.head_dim, dtype, device,
                         kv_layers=cfg.attention_layers, kv_dtype=kv_dtype)
        self.conv = {l: torch.zeros((la.conv_dim, la.conv_kernel - 1), dtype=dtype, device=device) for l in la.layers}
        self.state = {l: torch.zeros((la.num_v_heads, la.k_head_dim, la.v_head_dim), dtype=torch.float32,
                                     device=device) for l in la.layers}
        self.snapshots: dict[int, tuple[dict, dict]] = {}  # length -> copies of (conv, state) after that many tokens

    def reusable(self, n: int) -> int:
        """The longest prefix <= n whose states exist: the current length, a snapshot, or nothing."""
        if n >= self.length:
            return self.length
        return max((s for s in self.snapshots if s <= n), default=0)

    def truncate(self, length: int) -> None:
        if length == self.length:
            return
        if length and length not in self.snapshots:
            raise ValueError(f"hybrid cache: no recurrent state at length {length} (have {self.length} and "
                             f"snapshots {sorted(self.snapshots)}); reuse kv.reusable(n) tokens")
        super().truncate(length)
        conv, state = self.snapshots.get(length, (None, None))
        for l in self.conv:
            if conv is None:
                self.conv[l].zero_()
                self.state[l].zero_()
            else:
                self.conv[l].copy_(conv[l])
                self.state[l].copy_(state[l])
        self.snapshots = {s: v for s, v in self.snapshots.items() if s <= length}

    def snapshot(self) -> None:
        """Keep a copy of the states at the current length, so a later request can restart here."""
        self.snapshots[self.length] = ({l: t.clone() for l, t in self.conv.items()},
                                       {l: t.clone() for l, t in self.state.items()})

    def states_at(self, length: int) -> tuple[dict, dict] | None:
        """Copies of (conv, recurrent) states after `length` tokens: now, or a snapshot; None if neither."""
        if length == self.length:
            return ({l: t.clone() for l, t in self.conv.items()}, {l: t.clone() for l, t in self.state.items()})
        return self.snapshots.get(length)

    def load_states(self, conv: dict, state: dict) -> None:
        """Set the states to ones taken at the current length (a prefix cache's copy)."""
        for l in self.conv:
            self.conv[l].copy_(conv[l])
            self.state[l].copy_(state[l])

    def state_bytes(self) -> int:
        """Conv + recurrent state bytes of one sequence (what a snapshot costs)."""
        return sum(t.numel() * t.element_size() for t in (*self.conv.values(), *self.state.values()))
