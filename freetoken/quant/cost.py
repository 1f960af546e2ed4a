"""Bytes of one quantized expert matrix as its exporter stores it: what a fetch moves over PCIe."""

from __future__ import annotations

from freetoken.quant.config import QuantFormat


def expert_bytes(fmt: QuantFormat, out_dim: int, in_dim: int) -> int:
    """Packed weights + scales (+ zeros, g_idx) of one [out, in] matrix; fails naming a dim that does not fit."""
    fmt.check_dims(out_dim, in_dim, f"[{out_dim}, {in_dim}] matrix")
    n = out_dim * in_dim
    if fmt.kind in ("gptq", "awq"):
        groups = 1 if fmt.group_size == -1 else in_dim // fmt.group_size
        g_idx = 4 * in_dim if fmt.kind == "gptq" and fmt.desc_act else 0
        return n // 2 + groups * out_dim * 2 + groups * (out_dim // 8) * 4 + g_idx  # int4, fp16 scales, int32 zeros
    if fmt.kind == "fp8_block":
        b0, b1 = fmt.block
        return n + (-(-out_dim // b0)) * (-(-in_dim // b1)) * 4  # e4m3 + fp32 scale per block
    if fmt.kind == "fp8_channel":
        return n + out_dim * 4
    if fmt.kind == "mxfp4":
        return n // 2 + n // 32  # e2m1 + e8m0 per 32
    if fmt.kind == "nvfp4":
        return n // 2 + n // 16 + 4  # e2m1 + e4m3 per 16 + fp32 global
    raise AssertionError(fmt.kind)  # QuantFormat.__post_init__ admits only the kinds above
