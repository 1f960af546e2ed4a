"""Int4 group quantization: GPTQ / AutoRound (AutoGPTQ packing) and AWQ (GEMM packing).

Both store w[n, k] = scale[g, n] * (q[k, n] - zero[g, n]) with 8 nibbles per int32, low nibble first; they differ
in which axis is packed and in AWQ's interleaved nibble order.
"""

from __future__ import annotations

import torch

from freetoken.quant.config import QuantFormat
from freetoken.quant.errors import QuantError, check_shape, require

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ int32 holds column 8*c + AWQ_ORDER[i]
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)  # [8]


def unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """[R, C] int32 -> [8R, C]: nibble i of packed[r] is row 8r + i (GPTQ qweight)."""
    nib = (packed.unsqueeze(1) >> _SHIFTS.to(packed.device).view(1, 8, 1)) & 0xF  # [R, 8, C]
    return nib.reshape(-1, packed.shape[1])


def unpack_cols(packed: torch.Tensor, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """[R, C] int32 -> [R, 8C]: nibble i of packed[:, c] is column 8c + order[i] (GPTQ qzeros, AWQ)."""
    nib = (packed.unsqueeze(2) >> _SHIFTS.to(packed.device).view(1, 1, 8)) & 0xF  # [R, C, 8] in nibble order
    inverse = [order.index(j) for j in range(8)]  # column j sits in nibble inverse[j]
    return nib[:, :, inverse].reshape(packed.shape[0], -1)


def _groups(fmt: QuantFormat, in_dim: int, what: str) -> int:
    fmt.check_dims(0, in_dim, what)
    return 1 if fmt.group_size == -1 else in_dim // fmt.group_size


def dequantize_gptq(tensors: dict[str, torch.Tensor], prefix: str, fmt: QuantFormat,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`{prefix}.qweight` [in/8, out], `.qzeros` [G, out/8], `.scales` [G, out], optional `.g_idx` [in] -> [out, in]."""
    qw_name, qz_name, sc_name, gi_name = (f"{prefix}.{fmt.name(r)}" for r in ("qweight", "qzeros", "scales", "g_idx"))
    qweight = require(tensors, qw_name, (torch.int32,))
    in_dim, out_dim = qweight.shape[0] * 8, qweight.shape[1]
    if out_dim % 8:
        raise QuantError(f"tensor {qw_name!r}: out dim {out_dim} is not a multiple of 8 (qzeros packing)")
    groups = _groups(fmt, in_dim, qw_name)
    qzeros = require(tensors, qz_name, (torch.int32,))
    scales = require(tensors, sc_name, (torch.float16, torch.bfloat16, torch.float32))
    check_shape(qz_name, qzeros, (groups, out_dim // 8))
    check_shape(sc_name, scales, (groups, out_dim))
    if gi_name in tensors:
        g_idx = tensors[gi_name].to(torch.int64)
        check_shape(gi_name, g_idx, (in_dim,))
        if g_idx.numel() and (g_idx.min() < 0 or g_idx.max() >= groups):
            raise QuantError(f"tensor {gi_name!r}: group ids outside [0, {groups})")
    elif fmt.desc_act:
        raise QuantError(f"missing tensor {gi_name!r} (desc_act=true needs the act-order group index)")
    else:
        g_idx = torch.arange(in_dim, device=qweight.device) * groups // in_dim  # k // group_size, also for group_size -1
    q = unpack_rows(qweight).to(torch.float32)  # [in, out]
    zeros = (unpack_cols(qzeros) + fmt.zero_offset).to(torch.float32)  # [G, out]
    w = (q - zeros[g_idx]) * scales.to(torch.float32)[g_idx]  # [in, out]
    return w.t().contiguous().to(dtype)


def dequantize_awq(tensors: dict[str, torch.Tensor], prefix: str, fmt: QuantFormat,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`{prefix}.qweight` [in, out/8], `.qzeros` [G, out/8], `.scales` [G, out] (AWQ nibble order) -> [out, in]."""
    qw_name, qz_name, sc_name = (f"{prefix}.{fmt.name(r)}" for r in ("qweight", "qzeros", "scales"))
    qweight = require(tensors, qw_name, (torch.int32,))
    in_dim, out_dim = qweight.shape[0], qweight.shape[1] * 8
    groups = _groups(fmt, in_dim, qw_name)
    qzeros = require(tensors, qz_name, (torch.int32,))
    scales = require(tensors, sc_name, (torch.float16, torch.bfloat16, torch.float32))
    check_shape(qz_name, qzeros, (groups, out_dim // 8))
    check_shape(sc_name, scales, (groups, out_dim))
    g_idx = torch.arange(in_dim, device=qweight.device) * groups // in_dim
    q = unpack_cols(qweight, AWQ_ORDER).to(torch.float32)  # [in, out]
    zeros = unpack_cols(qzeros, AWQ_ORDER).to(torch.float32)  # [G, out]
    w = (q - zeros[g_idx]) * scales.to(torch.float32)[g_idx]
    return w.t().contiguous().to(dtype)
