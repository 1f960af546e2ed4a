"""NVFP4: e2m1 codes, one fp8 e4m3 scale per 16 inputs, one fp32 per-tensor scale.

The per-tensor scale has two conventions, told apart by the tensor name:
- compressed-tensors `weight_global_scale` = 448 * 6 / amax: the block scales were multiplied by it, so divide;
- NVIDIA ModelOpt `weight_scale_2` = amax / (448 * 6): multiply.
Applying one with the other's direction is off by a factor of (448*6/amax)**2 (tests/quant/test_nvfp4.py).
"""

from __future__ import annotations

import torch

from freetoken.quant.bits import decode_e2m1_packed, decode_e4m3
from freetoken.quant.config import QuantFormat
from freetoken.quant.errors import QuantError, as_bytes, check_shape, require


def dequantize_nvfp4(tensors: dict[str, torch.Tensor], prefix: str, fmt: QuantFormat,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`{prefix}.<packed>` [out, in/2] uint8, `.weight_scale` [out, in/16] e4m3, `.<global>` [1] -> [out, in]."""
    p_name, s_name, g_name = (f"{prefix}.{fmt.name(r)}" for r in ("packed", "scale", "global"))
    packed = as_bytes(p_name, require(tensors, p_name))
    out_dim, in_dim = packed.shape[0], packed.shape[1] * 2
    fmt.check_dims(out_dim, in_dim, p_name)
    scale = decode_e4m3(as_bytes(s_name, require(tensors, s_name)))
    check_shape(s_name, scale, (out_dim, in_dim // 16))
    glob = require(tensors, g_name).to(torch.float32)
    if glob.numel() != 1:
        raise QuantError(f"tensor {g_name!r}: {glob.numel()} elements, expected one per-tensor scale")
    block_scale = scale / glob.reshape(()) if fmt.global_scale == "divide" else scale * glob.reshape(())
    codes = decode_e2m1_packed(packed).reshape(out_dim, in_dim // 16, 16)
    return (codes * block_scale.unsqueeze(-1)).reshape(out_dim, in_dim).to(dtype)
