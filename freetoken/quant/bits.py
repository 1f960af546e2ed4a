"""Bit-level decoders for the small float formats, from the integer bits (no fp8 dtype needed on the device)."""

from __future__ import annotations

import torch

# e2m1 (OCP MX spec): sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0; code -> value
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def decode_e4m3(u8: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn bits -> fp32: bias 7, subnormals at exponent 0, 0x7f/0xff are NaN, no infinities."""
    b = u8.to(torch.int32)
    sign = torch.where(b & 0x80 != 0, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = (b & 0x7).to(torch.float32)
    normal = torch.ldexp(1.0 + man / 8.0, (exp - 7).to(torch.float32))
    subnormal = man / 8.0 * 2.0**-6
    val = torch.where(exp == 0, subnormal, normal)
    val = torch.where((b & 0x7F) == 0x7F, float("nan"), val)
    return sign * val


def decode_e8m0(u8: torch.Tensor) -> torch.Tensor:
    """e8m0 (MX block scale) bits -> fp32 power of two 2**(b - 127); 0xff is NaN."""
    b = u8.to(torch.int32)
    val = torch.ldexp(torch.ones_like(b, dtype=torch.float32), (b - 127).to(torch.float32))
    return torch.where(b == 0xFF, float("nan"), val)


def decode_e2m1_packed(u8: torch.Tensor) -> torch.Tensor:
    """[..., n] bytes, two e2m1 codes each, low nibble first -> [..., 2n] fp32."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=u8.device)
    b = u8.to(torch.int64)
    vals = torch.stack([lut[b & 0xF], lut[b >> 4]], dim=-1)  # [..., n, 2]
    return vals.reshape(*u8.shape[:-1], 2 * u8.shape[-1])
