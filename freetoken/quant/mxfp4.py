"""MXFP4 (OCP microscaling), gpt-oss layout: e2m1 codes in `_blocks`, one e8m0 exponent per 32 inputs in `_scales`.

gpt-oss stores all experts of a projection in one tensor: `{prefix}_blocks` [E, out, in/32, 16] uint8 (two codes a
byte, low nibble = even element) and `{prefix}_scales` [E, out, in/32] uint8 (2**(s - 127)).
"""

from __future__ import annotations

import torch

from freetoken.quant.bits import decode_e2m1_packed, decode_e8m0
from freetoken.quant.config import QuantFormat
from freetoken.quant.errors import QuantError, as_bytes, check_shape, require


def dequantize_mxfp4(tensors: dict[str, torch.Tensor], prefix: str, fmt: QuantFormat, expert: int,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Expert `expert` of `{prefix}_blocks` / `{prefix}_scales` -> [out, in]."""
    b_name, s_name = prefix + fmt.name("blocks"), prefix + fmt.name("scales")
    blocks = as_bytes(b_name, require(tensors, b_name))
    scales = as_bytes(s_name, require(tensors, s_name))
    if blocks.dim() != 4 or blocks.shape[-1] != fmt.group_size // 2:
        raise QuantError(f"tensor {b_name!r}: shape {tuple(blocks.shape)}, expected [E, out, in/32, 16]")
    check_shape(s_name, scales, tuple(blocks.shape[:3]))
    if not 0 <= expert < blocks.shape[0]:
        raise QuantError(f"tensor {b_name!r}: expert {expert} outside [0, {blocks.shape[0]})")
    codes = decode_e2m1_packed(blocks[expert])  # [out, G, 32]
    w = codes * decode_e8m0(scales[expert]).unsqueeze(-1)
    return w.reshape(w.shape[0], -1).to(dtype)
