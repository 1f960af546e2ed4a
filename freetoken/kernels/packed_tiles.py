"""One [BLOCK_K, BLOCK_N] tile of W.T dequantized in registers from a `PackedWeight` slot (freetoken/quant/packed.py).

Each kind reads its packed uint8 tensors and rebuilds the fp32 values from the integer bits, in the order
`dequantize_packed` computes them, so a kernel built on `packed_tile` reproduces the torch reference bit for bit in
fp32 (and the interpreter never has to load an fp8 pointer). Tiles index absolute input positions `offs_k`, so a
tile may straddle scale groups / blocks; every element gathers its own scale.
"""

from __future__ import annotations

import triton
import triton.language as tl

TINY_E8M0 = tl.constexpr(2.0**-127)  # e8m0 code 0: a subnormal fp32 that the bit shift below cannot build
QUIET_NAN_BITS = tl.constexpr(0x7FC00000)  # OR-ed into a code: a NaN (a nan constexpr never equals itself)


@triton.jit
def e4m3_bits_to_fp32(b):
    """float8_e4m3fn codes (int32 0..255) -> fp32: bias 7, subnormals at exponent 0, 0x7f / 0xff NaN."""
    exp = (b >> 3) & 0xF
    man = b & 0x7
    normal = (((b & 0x80) << 24) | ((exp + 120) << 23) | (man << 20)).to(tl.float32, bitcast=True)
    subnormal = man.to(tl.float32) * 0.001953125  # man / 8 * 2**-6, exact
    val = tl.where(exp == 0, tl.where((b & 0x80) != 0, -subnormal, subnormal), normal)
    return tl.where((b & 0x7F) == 0x7F, (b | QUIET_NAN_BITS).to(tl.float32, bitcast=True), val)


@triton.jit
def e8m0_bits_to_fp32(b):
    """e8m0 codes (int32 0..255) -> 2**(b - 127); 0xff NaN."""
    val = tl.where(b == 0, TINY_E8M0, (b << 23).to(tl.float32, bitcast=True))
    return tl.where(b == 0xFF, (b | QUIET_NAN_BITS).to(tl.float32, bitcast=True), val)


@triton.jit
def e2m1_bits_to_fp32(c):
    """e2m1 codes (int32 0..15) -> fp32: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0."""
    exp = (c >> 1) & 0x3
    half_man = (c & 0x1).to(tl.float32) * 0.5
    mag = tl.where(exp == 0, half_man, (1.0 + half_man) * ((1 << exp) >> 1).to(tl.float32))
    return tl.where((c & 0x8) != 0, -mag, mag)


@triton.jit
def int4_tile(data_ptr, scales_ptr, zeros_ptr, g_idx_ptr, offs_k, offs_n, N, K,
              stride_dn, stride_sn, stride_zn, GROUP: tl.constexpr, HAS_G_IDX: tl.constexpr):
    """w[k, n] = (q - zeros[n, g]) * scales[n, g], q the nibble k % 2 of byte k // 2, g = g_idx[k] or k // GROUP."""
    kmask = offs_k < K
    mask = kmask[:, None] & (offs_n[None, :] < N)
    byte = tl.load(data_ptr + offs_n[None, :] * stride_dn + offs_k[:, None] // 2, mask=mask, other=0).to(tl.int32)
    q = (byte >> ((offs_k[:, None] % 2) * 4)) & 0xF  # [BK, BN]
    if HAS_G_IDX:
        g = tl.load(g_idx_ptr + offs_k, mask=kmask, other=0)
    else:
        g = offs_k // GROUP
    z = tl.load(zeros_ptr + offs_n[None, :] * stride_zn + g[:, None], mask=mask, other=0).to(tl.int32)
    s = tl.load(scales_ptr + offs_n[None, :] * stride_sn + g[:, None], mask=mask, other=0.0).to(tl.float32)
    return (q - z).to(tl.float32) * s


@triton.jit
def fp8_tile(data_ptr, scales_ptr, offs_k, offs_n, N, K, stride_dn, stride_sn,
             BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """w[k, n] = e4m3(data[n, k]) * scales[n // BLOCK_ROWS, k // BLOCK_COLS] (per channel: blocks (1, K))."""
    mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
    b = tl.load(data_ptr + offs_n[None, :] * stride_dn + offs_k[:, None], mask=mask, other=0).to(tl.int32)
    s = tl.load(scales_ptr + (offs_n[None, :] // BLOCK_ROWS) * stride_sn + offs_k[:, None] // BLOCK_COLS,
                mask=mask, other=0.0).to(tl.float32)
    return e4m3_bits_to_fp32(b) * s


@triton.jit
def fp4_tile(data_ptr, scales_ptr, global_scale, offs_k, offs_n, N, K, stride_dn, stride_sn,
             GROUP: tl.constexpr, SCALE_CODE: tl.constexpr, GLOBAL_OP: tl.constexpr):
    """w[k, n] = e2m1(code) * (decode(scales[n, k // GROUP]) / or * global_scale), the global op first as in torch."""
    mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
    byte = tl.load(data_ptr + offs_n[None, :] * stride_dn + offs_k[:, None] // 2, mask=mask, other=0).to(tl.int32)
    code = (byte >> ((offs_k[:, None] % 2) * 4)) & 0xF  # [BK, BN]
    sb = tl.load(scales_ptr + offs_n[None, :] * stride_sn + offs_k[:, None] // GROUP, mask=mask, other=0)
    if SCALE_CODE == "e8m0":
        s = e8m0_bits_to_fp32(sb.to(tl.int32))
    else:
        s = e4m3_bits_to_fp32(sb.to(tl.int32))
    if GLOBAL_OP == "divide":
        s = tl.div_rn(s, global_scale)  # correctly rounded, as torch divides
    elif GLOBAL_OP == "multiply":
        s = s * global_scale
    return e2m1_bits_to_fp32(code) * s


@triton.jit
def slot_tile(data_ptr, scales_ptr, zeros_ptr, g_idx_ptr, global_ptr, slot, offs_k, offs_n, N, K,
              stride_ds, stride_dn, stride_ss, stride_sn, stride_zs, stride_zn, stride_gs,
              KIND: tl.constexpr, GROUP: tl.constexpr, HAS_G_IDX: tl.constexpr, BLOCK_ROWS: tl.constexpr,
              BLOCK_COLS: tl.constexpr, SCALE_CODE: tl.constexpr, GLOBAL_OP: tl.constexpr):
    """fp32 tile [BK, BN] of W.T for slot `slot` of a PackedWeight [S, N, K] (tensor pointers at slot 0)."""
    s = slot.to(tl.int64)
    if KIND == "int4":
        w = int4_tile(data_ptr + s * stride_ds, scales_ptr + s * stride_ss, zeros_ptr + s * stride_zs,
                      g_idx_ptr + s * stride_gs, offs_k, offs_n, N, K, stride_dn, stride_sn, stride_zn,
                      GROUP, HAS_G_IDX)
    elif KIND == "fp8":
        w = fp8_tile(data_ptr + s * stride_ds, scales_ptr + s * stride_ss, offs_k, offs_n, N, K,
                     stride_dn, stride_sn, BLOCK_ROWS, BLOCK_COLS)
    else:
        if GLOBAL_OP == "":
            global_scale = 1.0
        else:
            global_scale = tl.load(global_ptr + s)
        w = fp4_tile(data_ptr + s * stride_ds, scales_ptr + s * stride_ss, global_scale, offs_k, offs_n, N, K,
                     stride_dn, stride_sn, GROUP, SCALE_CODE, GLOBAL_OP)
    return w
