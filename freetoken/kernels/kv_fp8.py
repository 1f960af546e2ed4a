"""The FP8 KV cache format: e4m3 codes with one fp32 scale per (token, kv head) (its byte cost: freetoken/kv_dtype.py).

Granularity: when a token's K (and V) are appended, each kv head's Dh values get scale = max|x| / 448 (448 = the
largest finite e4m3), and codes = e4m3(x / scale) stored as their uint8 bits. Per (token, head) because a scale
must be final when the token is written (a per-tensor scale would need the future's amax) and heads differ in
range; e4m3's own exponent covers the spread inside one head vector. Cost: Dh + 4 bytes per (token, head) for K and
again for V, against 2 Dh in bf16 (Dh = 128: 0.516x).

The attention kernels read the uint8 codes, rebuild fp32 by bit manipulation (packed_tiles.e4m3_bits_to_fp32: the
interpreter cannot load fp8 pointers) and fold the scales into the scores (K) and the probabilities (V). The torch
side here decodes through torch's own float8_e4m3fn: an independent oracle for the kernels' bit decoding.
"""

from __future__ import annotations

import torch


E4M3_MAX = 448.0


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, Hkv, Dh] -> (codes [T, Hkv, Dh] uint8, scales [T, Hkv] fp32); an all-zero head gets scale 1."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1)  # [T, Hkv]
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    codes = (xf / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return codes, scale


def dequantize_kv(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """codes [..., Dh] uint8, scale [...] fp32 -> fp32 [..., Dh]."""
    return codes.view(torch.float8_e4m3fn).float() * scale[..., None]

