"""A contiguous per-layer KV cache with an explicit length, reusable across calls (prefix reuse truncates it).

kv_dtype: auto keeps K/V in the model's dtype, bf16 in bfloat16, fp8 as e4m3 codes (uint8) with one fp32 scale per
(token, kv head), quantized as each token is written (freetoken/kernels/kv_fp8.py); the attention kernels take the
scales through `scales(layer)`.
"""

from __future__ import annotations

import torch

from freetoken.kernels.kv_fp8 import quantize_kv
from freetoken.kv_dtype import SCALE_BYTES, check_kv_dtype


class KVCache:
    """k[l], v[l]: [max_tokens, Hkv, Dh]. `length` tokens hold valid keys; a forward at start_pos writes
    [start_pos, start_pos + T) and sets length = start_pos + T (positions after it are stale, never read)."""

    def __init__(self, num_layers: int, max_tokens: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str, kv_layers: tuple[int, ...] | None = None,
                 kv_dtype: str = "auto"):
        """kv_layers: the layers that keep KV (default all; the others get empty [0, Hkv, Dh] tensors)."""
        if max_tokens <= 0:
            raise ValueError(f"KV cache max_tokens must be positive, got {max_tokens}")
        self.kv_dtype = check_kv_dtype(kv_dtype, "kv_dtype")
        self.fp8 = kv_dtype == "fp8"
        store = {"auto": dtype, "bf16": torch.bfloat16, "fp8": torch.uint8}[kv_dtype]
        keep = set(range(num_layers) if kv_layers is None else kv_layers)
        shapes = [((max_tokens if l in keep else 0), num_kv_heads, head_dim) for l in range(num_layers)]
        self.k = [torch.zeros(shape, dtype=store, device=device) for shape in shapes]
        self.v = [torch.zeros(shape, dtype=store, device=device) for shape in shapes]
        if self.fp8:  # [max_tokens, Hkv] per layer
            self.k_scale = [torch.ones(shape[:2], dtype=torch.float32, device=device) for shape in shapes]
            self.v_scale = [torch.ones(shape[:2], dtype=torch.float32, device=device) for shape in shapes]
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
        end = start_pos + k.shape[0]
        if not self.fp8:
            self.k[layer][start_pos:end] = k
            self.v[layer][start_pos:end] = v
            return
        self.k[layer][start_pos:end], self.k_scale[layer][start_pos:end] = quantize_kv(k)
        self.v[layer][start_pos:end], self.v_scale[layer][start_pos:end] = quantize_kv(v)

    def scales(self, layer: int) -> dict[str, torch.Tensor]:
        """The attention kernels' k_scale / v_scale arguments for this layer (none unless fp8)."""
        return {"k_scale": self.k_scale[layer], "v_scale": self.v_scale[layer]} if self.fp8 else {}

    def read(self, layer: int, start: int, stop: int) -> torch.Tensor:
        """Positions [start, stop) as stored, [2, T, Hkv, Dh] (K, V); fp8: uint8 [2, T, Hkv, Dh + 4], each row's
        fp32 scale as its last 4 bytes (a prefix cache keeps pieces without re-quantizing them)."""
        k, v = self.k[layer][start:stop], self.v[layer][start:stop]
        if self.fp8:
            k = torch.cat([k, self.k_scale[layer][start:stop, :, None].view(torch.uint8)], dim=-1)
            v = torch.cat([v, self.v_scale[layer][start:stop, :, None].view(torch.uint8)], dim=-1)
        return torch.stack([k, v])

    def load(self, layer: int, start_pos: int, piece: torch.Tensor) -> None:
        """Write a `read` piece back at start_pos, byte for byte."""
        T, Dh = piece.shape[1], self.k[layer].shape[-1]
        self.k[layer][start_pos:start_pos + T] = piece[0, ..., :Dh]
        self.v[layer][start_pos:start_pos + T] = piece[1, ..., :Dh]
        if self.fp8:
            scales = piece[..., Dh:Dh + SCALE_BYTES].contiguous().view(torch.float32)[..., 0]  # [2, T, Hkv]
            self.k_scale[layer][start_pos:start_pos + T] = scales[0]
            self.v_scale[layer][start_pos:start_pos + T] = scales[1]

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
