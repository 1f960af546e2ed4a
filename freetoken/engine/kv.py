"""A contiguous per-layer KV cache with an explicit length, reusable across calls (prefix reuse truncates it)."""

from __future__ import annotations

import torch


class KVCache:
    """k[l], v[l]: [max_tokens, Hkv, Dh]. `length` tokens hold valid keys; a forward at start_pos writes
    [start_pos, start_pos + T) and sets length = start_pos + T (positions after it are stale, never read)."""

    def __init__(self, num_layers: int, max_tokens: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str, kv_layers: tuple[int, ...] | None = None):
        """kv_layers: the layers that keep KV (default all; the others get empty [0, Hkv, Dh] tensors)."""
        if max_tokens <= 0:
            raise ValueError(f"KV cache max_tokens must be positive, got {max_tokens}")
        keep = set(range(num_layers) if kv_layers is None else kv_layers)
        shapes = [((max_tokens if l in keep else 0), num_kv_heads, head_dim) for l in range(num_layers)]
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for shape in shapes]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for shape in shapes]
        self.max_tokens = max_tokens
        self.length = 0
        self.tokens: list[int] = []  # the token ids whose keys the cache holds, position by position

    def check_room(self, start_pos: int, n: int) -> None:
        if not 0 <= start_pos <= self.length:
            raise ValueError(f"start_pos {start_pos} must lie in [0, {self.length}] (the cache's filled length)")
        if start_pos + n > self.max_tokens:
            raise ValueError(f"context of {start_pos + n} tokens exceeds the KV cache's {self.max_tokens}")

    def write(self, layer: int, start_pos: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [T, Hkv, Dh] at positions [start_pos, start_pos + T)."""
        self.k[layer][start_pos:start_pos + k.shape[0]] = k
        self.v[layer][start_pos:start_pos + v.shape[0]] = v

    def commit(self, start_pos: int, token_ids: list[int]) -> None:
        self.tokens[start_pos:] = list(token_ids)
        self.length = start_pos + len(token_ids)

    def reusable(self, n: int) -> int:
        """How many of n leading tokens can be kept: all of them (KV can be cut anywhere)."""
        return min(n, self.length)

    def truncate(self, length: int) -> None:
        """Keep the first `length` positions (a shared prefix); later writes overwrite the rest."""
        if not 0 <= length <= self.length:
            raise ValueError(f"truncate length {length} must lie in [0, {self.length}]")
        self.length = length
        del self.tokens[length:]

    def common_prefix(self, token_ids: list[int]) -> int:
        """How many leading tokens of token_ids the cache already holds."""
        n = 0
        for a, b in zip(self.tokens, token_ids):
            if a != b:
                break
            n += 1
        return n
