"""DeepSeek-V4's per-sequence cache: per layer one key = value row per token (the sliding window reads the last
`window` of them; rows are kept whole, as gpt-oss's sliding layers keep theirs), the compressed entries of csa / hca
layers (entry e summarises tokens [e m, (e + 1) m)) and a csa layer's indexer entries, and per compressing layer the
projected rows of the window in progress (and, csa, of the window before it, whose first halves the next entry
overlaps). Those rows exist only where the sequence stands: like a recurrent state they cannot be cut back, so a
shorter prefix restarts from a snapshot (state_kv.StatefulKV). Entries and rows past the length are never read.
"""

from __future__ import annotations

import torch

from freetoken.engine.state_kv import StatefulKV
from freetoken.models.config import ModelConfig


class V4KV(StatefulKV):
    """k[l] [max_tokens, 1, Dh] (v is k); entries[l] [max_tokens // m, Dh], index_entries[l] [max_tokens // m, Di];
    win_kv[l] / win_gate[l] [windows, m, pairs x Dh] (csa: 2 windows, previous then current, 2 x Dh channels; hca:
    the current one, Dh), iwin_kv[l] / iwin_gate[l] the indexer's."""

    def __init__(self, cfg: ModelConfig, max_tokens: int, dtype: torch.dtype, device: torch.device | str,
                 kv_dtype: str = "auto"):
        if kv_dtype == "fp8":
            raise ValueError("kv_dtype fp8: DeepSeek-V4's cache (one key = value row per token, compressed entries) "
                             "is kept in the model's dtype; use auto or bf16")
        super().__init__(cfg.num_layers, max_tokens, 1, cfg.head_dim, dtype, device, kv_layers=(), kv_dtype=kv_dtype)
        store = {"auto": dtype, "bf16": torch.bfloat16}[kv_dtype]
        v, Dh, Di = cfg.v4, cfg.head_dim, cfg.v4.index_head_dim
        self.k = [torch.zeros((max_tokens, 1, Dh), dtype=store, device=device) for _ in range(cfg.num_layers)]
        self.v = self.k  # K = V
        self.entries, self.index_entries = {}, {}
        self.win_kv, self.win_gate, self.iwin_kv, self.iwin_gate = {}, {}, {}, {}
        states = {}
        for l, kind in enumerate(v.kinds):
            m = v.rate(l)
            if not m:
                continue
            self.entries[l] = torch.zeros((max_tokens // m, Dh), dtype=store, device=device)
            windows, pairs = (2, 2) if kind == "csa" else (1, 1)
            self.win_kv[l] = torch.zeros((windows, m, pairs * Dh), dtype=dtype, device=device)
            self.win_gate[l] = torch.zeros((windows, m, pairs * Dh), dtype=dtype, device=device)
            states.update({f"win_kv{l}": self.win_kv[l], f"win_gate{l}": self.win_gate[l]})
            if kind == "csa":
                self.index_entries[l] = torch.zeros((max_tokens // m, Di), dtype=store, device=device)
                self.iwin_kv[l] = torch.zeros((2, m, 2 * Di), dtype=dtype, device=device)
                self.iwin_gate[l] = torch.zeros((2, m, 2 * Di), dtype=dtype, device=device)
                states.update({f"iwin_kv{l}": self.iwin_kv[l], f"iwin_gate{l}": self.iwin_gate[l]})
        self.keep_states(states)

    def write(self, layer: int, start_pos: int, k: torch.Tensor, v: torch.Tensor | None = None) -> None:
        """k [T, 1, Dh] at positions [start_pos, start_pos + T) (the value is the key)."""
        self.k[layer][start_pos:start_pos + k.shape[0]] = k

    def cache_bytes(self) -> int:
        """Every token row, entry and window row the cache holds (what max_tokens costs)."""
        tensors = [*self.k, *self.entries.values(), *self.index_entries.values(), *self._states.values()]
        return sum(t.numel() * t.element_size() for t in tensors)
