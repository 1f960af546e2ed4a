"""Bytes of one quantized expert matrix: as the engine holds it (`expert_bytes`, the PackedWeight layout of
packed.py: what a slot holds and a fetch moves over PCIe) and as its exporter stored it (`stored_bytes`, on disk).

They differ for int4: checkpoints pack 8 zero points into an int32, PackedWeight keeps one uint8 per group per
row (N * G / 2 bytes more per matrix), and drops an act-order g_idx when one group spans the inputs. (A DeepSeek
`scale_fmt: ue8m0` FP8 checkpoint stores one byte per block scale, widened to fp32 at repack; QuantFormat does not
record it, so `stored_bytes` counts fp32 there.)
"""

from __future__ import annotations

from freetoken.quant.config import QuantFormat

INT4_SCALE_BYTES = 2  # fp16 scales, kept as the checkpoint stores them
FP8_SCALE_BYTES = 4  # fp32 per block (e8m0 checkpoint scales are widened at repack)


def _int4_groups(fmt: QuantFormat, in_dim: int) -> int:
    return 1 if fmt.group_size == -1 else in_dim // fmt.group_size


def has_g_idx(fmt: QuantFormat, in_dim: int) -> bool:
    """Act-order GPTQ keeps its int32 g_idx [K], unless one group spans the inputs (every id is then 0, and the
    repacker drops a g_idx equal to k // group)."""
    return fmt.kind == "gptq" and fmt.desc_act and _int4_groups(fmt, in_dim) > 1


def expert_bytes(fmt: QuantFormat, out_dim: int, in_dim: int) -> int:
    """PackedWeight.nbytes_per_slot of one [out, in] matrix in `fmt`; fails naming a dim that does not fit."""
    fmt.check_dims(out_dim, in_dim, f"[{out_dim}, {in_dim}] matrix")
    n = out_dim * in_dim
    if fmt.kind in ("gptq", "awq"):  # data [N, K/2] u8, scales [N, G] fp16, zeros [N, G] u8, g_idx [K] i32
        groups = _int4_groups(fmt, in_dim)
        return n // 2 + out_dim * groups * (INT4_SCALE_BYTES + 1) + (4 * in_dim if has_g_idx(fmt, in_dim) else 0)
    if fmt.kind == "fp8_block":  # data [N, K] u8, scales [ceil(N/b0), ceil(K/b1)] fp32
        b0, b1 = fmt.block
        return n + (-(-out_dim // b0)) * (-(-in_dim // b1)) * FP8_SCALE_BYTES
    if fmt.kind == "fp8_channel":  # block (1, K): scales [N, 1] fp32
        return n + out_dim * FP8_SCALE_BYTES
    if fmt.kind == "mxfp4":  # data [N, K/2] u8, e8m0 scales [N, K/32] u8
        return n // 2 + n // 32
    if fmt.kind == "nvfp4":  # data [N, K/2] u8, e4m3 scales [N, K/16] u8, global_scale fp32 per slot
        return n // 2 + n // 16 + 4
    raise AssertionError(fmt.kind)  # QuantFormat.__post_init__ admits only the kinds above


def stored_bytes(fmt: QuantFormat, out_dim: int, in_dim: int) -> int:
    """Bytes of one [out, in] matrix in the checkpoint's own tensors (packed weights, scales, zeros, g_idx)."""
    fmt.check_dims(out_dim, in_dim, f"[{out_dim}, {in_dim}] matrix")
    if fmt.kind in ("gptq", "awq"):  # zeros: int32 [G, N/8] instead of uint8 [N, G]
        groups = _int4_groups(fmt, in_dim)
        return (out_dim * in_dim // 2 + groups * out_dim * INT4_SCALE_BYTES + groups * (out_dim // 8) * 4
                + (4 * in_dim if fmt.kind == "gptq" and fmt.desc_act else 0))
    return expert_bytes(fmt, out_dim, in_dim)  # the other formats repack byte for byte


def describe(fmt: QuantFormat) -> str:
    """One short name for tables: 'gptq int4 g128', 'fp8 block 128x128', 'nvfp4'."""
    if fmt.kind in ("gptq", "awq"):
        group = "per-channel" if fmt.group_size == -1 else f"g{fmt.group_size}"
        return f"{fmt.kind} int4 {group}" + (" act-order" if fmt.kind == "gptq" and fmt.desc_act else "")
    if fmt.kind == "fp8_block":
        return f"fp8 block {fmt.block[0]}x{fmt.block[1]}"
    if fmt.kind == "fp8_channel":
        return "fp8 per-channel"
    return fmt.kind
