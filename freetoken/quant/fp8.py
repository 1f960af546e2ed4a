"""FP8 e4m3 weights: DeepSeek-style 128x128 block scales (`weight_scale_inv`) and per-channel scales.

Both scales multiply (DeepSeek's `weight_scale_inv` is the inverse of the quantizing scale, i.e. the dequant scale).
"""

from __future__ import annotations

import torch

from freetoken.quant.bits import decode_e4m3, decode_e8m0
from freetoken.quant.config import QuantFormat
from freetoken.quant.errors import as_bytes, check_shape, require


def _weight(tensors: dict[str, torch.Tensor], prefix: str, fmt: QuantFormat) -> torch.Tensor:
    name = f"{prefix}.{fmt.name('weight')}"
    return decode_e4m3(as_bytes(name, require(tensors, name)))  # [out, in]


def _scale(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    s = require(tensors, name)
    if s.element_size() == 1:  # ue8m0 scale_fmt: power-of-two exponents
        return decode_e8m0(as_bytes(name, s))
    return s.to(torch.float32)


def dequantize_fp8_block(tensors: dict[str, torch.Tensor], prefix: str, fmt: QuantFormat,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`{prefix}.weight` [out, in] e4m3, `.weight_scale_inv` [ceil(out/b0), ceil(in/b1)] -> [out, in]."""
    w = _weight(tensors, prefix, fmt)
    s_name = f"{prefix}.{fmt.name('scale')}"
    scale = _scale(tensors, s_name)
    (b0, b1), (out_dim, in_dim) = fmt.block, w.shape
    check_shape(s_name, scale, (-(-out_dim // b0), -(-in_dim // b1)))
    full = scale.repeat_interleave(b0, 0)[:out_dim].repeat_interleave(b1, 1)[:, :in_dim]  # [out, in]
    return (w * full).to(dtype)


def dequantize_fp8_channel(tensors: dict[str, torch.Tensor], prefix: str, fmt: QuantFormat,
                           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`{prefix}.weight` [out, in] e4m3, `.weight_scale` [out, 1] (or [out]) -> [out, in]."""
    w = _weight(tensors, prefix, fmt)
    s_name = f"{prefix}.{fmt.name('scale')}"
    scale = _scale(tensors, s_name)
    if scale.dim() == 1:
        scale = scale[:, None]
    check_shape(s_name, scale, (w.shape[0], 1))
    return (w * scale).to(dtype)
