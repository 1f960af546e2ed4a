"""One [BLOCK_K, BLOCK_N] tile of W.T dequantized in registers from a `PackedWeight` slot (freetoken/quant/packed.py).

Each kind reads its packed uint8 tensors and rebuilds the fp32 values from the integer bits, in the order
`dequantize_packed` computes them, so a kernel built on `packed_tile` reproduces the torch reference bit for bit in
fp32 (and the interpreter never has to load an fp8 pointer).

Two ways to load a tile starting at input k0 (a multiple of BLOCK_K):
- vectorised (`*_tile_vec`, whenever the scale groups / blocks tile BLOCK_K evenly and there is no act-order g_idx):
  each packed byte is loaded once as a [BN, BK/2] tile and split into its two nibbles (interleaved back to k order),
  and each scale once per group: one value per row when a group spans the tile, a [BN, BK/GROUP] tile broadcast over
  its group otherwise;
- gathered (`int4_tile`, `fp8_tile`, `fp4_tile`): every element loads its byte and its scale (act-order g_idx, and
  groups that straddle tiles).
"""

from __future__ import annotations

from freetoken.kernels.lazy import tl, triton

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
def _group_scales(scales_ptr, k0, offs_n, nmask, N, K, stride_sn, GROUP: tl.constexpr, BLOCK_K: tl.constexpr):
    """Raw scale entries of tile [k0, k0 + BLOCK_K) for rows offs_n: [BN, 1] when one group spans the tile (GROUP a
    multiple of BLOCK_K), else [BN, BLOCK_K / GROUP] (BLOCK_K a multiple of GROUP)."""
    if GROUP % BLOCK_K == 0:
        return tl.load(scales_ptr + offs_n * stride_sn + k0 // GROUP, mask=nmask, other=0)[:, None]
    else:
        offs_g = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
        return tl.load(scales_ptr + offs_n[:, None] * stride_sn + offs_g[None, :],
                       mask=nmask[:, None] & (offs_g[None, :] * GROUP < K), other=0)


@triton.jit
def _per_k(v, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BN, 1] or [BN, BK / GROUP] per-group values -> broadcastable over [BN, BK] in k order."""
    if GROUP % BLOCK_K == 0:
        return v
    else:
        return tl.reshape(tl.broadcast_to(v[:, :, None], (BLOCK_N, BLOCK_K // GROUP, GROUP)), (BLOCK_N, BLOCK_K))


@triton.jit
def _nibbles(data_ptr, k0, offs_n, nmask, K, stride_dn, BLOCK_K: tl.constexpr):
    """The 4-bit codes of tile [k0, k0 + BLOCK_K) of rows offs_n as int32 [BN, BK]: one load per byte, low nibble
    first (element k in byte k // 2)."""
    offs_b = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    byte = tl.load(data_ptr + offs_n[:, None] * stride_dn + offs_b[None, :],
                   mask=nmask[:, None] & (offs_b[None, :] < K // 2), other=0).to(tl.int32)  # [BN, BK/2]
    return tl.interleave(byte & 0xF, byte >> 4)


@triton.jit
def int4_tile_vec(data_ptr, scales_ptr, zeros_ptr, k0, offs_n, N, K, stride_dn, stride_sn, stride_zn,
                  GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """int4_tile without act order, loaded a byte and a scale group at a time -> fp32 [BK, BN]."""
    nmask = offs_n < N
    q = _nibbles(data_ptr, k0, offs_n, nmask, K, stride_dn, BLOCK_K)
    z = _per_k(_group_scales(zeros_ptr, k0, offs_n, nmask, N, K, stride_zn, GROUP, BLOCK_K).to(tl.int32),
               GROUP, BLOCK_N, BLOCK_K)
    s = _per_k(_group_scales(scales_ptr, k0, offs_n, nmask, N, K, stride_sn, GROUP, BLOCK_K).to(tl.float32),
               GROUP, BLOCK_N, BLOCK_K)
    w = (q - z).to(tl.float32) * s  # [BN, BK]
    return tl.trans(tl.where((k0 + tl.arange(0, BLOCK_K))[None, :] < K, w, 0.0))


@triton.jit
def fp8_tile_vec(data_ptr, scales_ptr, k0, offs_n, N, K, stride_dn, stride_sn,
                 BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp8_tile when a scale block spans the tile's columns (BLOCK_COLS a multiple of BLOCK_K): one scale per row."""
    nmask = offs_n < N
    offs_k = k0 + tl.arange(0, BLOCK_K)
    b = tl.load(data_ptr + offs_n[:, None] * stride_dn + offs_k[None, :],
                mask=nmask[:, None] & (offs_k[None, :] < K), other=0).to(tl.int32)  # [BN, BK]
    s = tl.load(scales_ptr + (offs_n // BLOCK_ROWS) * stride_sn + k0 // BLOCK_COLS, mask=nmask, other=0.0)
    return tl.trans(e4m3_bits_to_fp32(b) * s.to(tl.float32)[:, None])


@triton.jit
def fp4_tile_vec(data_ptr, scales_ptr, global_scale, k0, offs_n, N, K, stride_dn, stride_sn,
                 GROUP: tl.constexpr, SCALE_CODE: tl.constexpr, GLOBAL_OP: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp4_tile loaded a byte and a scale group at a time (each scale code decoded once per group) -> fp32 [BK, BN]."""
    nmask = offs_n < N
    code = _nibbles(data_ptr, k0, offs_n, nmask, K, stride_dn, BLOCK_K)
    sb = _group_scales(scales_ptr, k0, offs_n, nmask, N, K, stride_sn, GROUP, BLOCK_K).to(tl.int32)
    if SCALE_CODE == "e8m0":
        s = e8m0_bits_to_fp32(sb)
    else:
        s = e4m3_bits_to_fp32(sb)
    if GLOBAL_OP == "divide":
        s = tl.div_rn(s, global_scale)
    elif GLOBAL_OP == "multiply":
        s = s * global_scale
    w = e2m1_bits_to_fp32(code) * _per_k(s, GROUP, BLOCK_N, BLOCK_K)  # [BN, BK]
    return tl.trans(tl.where((k0 + tl.arange(0, BLOCK_K))[None, :] < K, w, 0.0))


@triton.jit
def slot_tile(data_ptr, scales_ptr, zeros_ptr, g_idx_ptr, global_ptr, slot, k0, offs_n, N, K,
              stride_ds, stride_dn, stride_ss, stride_sn, stride_zs, stride_zn, stride_gs,
              KIND: tl.constexpr, GROUP: tl.constexpr, HAS_G_IDX: tl.constexpr, BLOCK_ROWS: tl.constexpr,
              BLOCK_COLS: tl.constexpr, SCALE_CODE: tl.constexpr, GLOBAL_OP: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 tile [BK, BN] of W.T, inputs [k0, k0 + BLOCK_K), for slot `slot` of a PackedWeight [S, N, K] (tensor
    pointers at slot 0); vectorised wherever the layout allows (module docstring)."""
    s = slot.to(tl.int64)
    offs_k = k0 + tl.arange(0, BLOCK_K)
    if KIND == "int4":
        if (GROUP % BLOCK_K == 0 or BLOCK_K % GROUP == 0) and not HAS_G_IDX:
            w = int4_tile_vec(data_ptr + s * stride_ds, scales_ptr + s * stride_ss, zeros_ptr + s * stride_zs,
                              k0, offs_n, N, K, stride_dn, stride_sn, stride_zn, GROUP, BLOCK_N, BLOCK_K)
        else:
            w = int4_tile(data_ptr + s * stride_ds, scales_ptr + s * stride_ss, zeros_ptr + s * stride_zs,
                          g_idx_ptr + s * stride_gs, offs_k, offs_n, N, K, stride_dn, stride_sn, stride_zn,
                          GROUP, HAS_G_IDX)
    elif KIND == "fp8":
        if BLOCK_COLS % BLOCK_K == 0:
            w = fp8_tile_vec(data_ptr + s * stride_ds, scales_ptr + s * stride_ss, k0, offs_n, N, K,
                             stride_dn, stride_sn, BLOCK_ROWS, BLOCK_COLS, BLOCK_K)
        else:
            w = fp8_tile(data_ptr + s * stride_ds, scales_ptr + s * stride_ss, offs_k, offs_n, N, K,
                         stride_dn, stride_sn, BLOCK_ROWS, BLOCK_COLS)
    else:
        if GLOBAL_OP == "":
            global_scale = 1.0
        else:
            global_scale = tl.load(global_ptr + s)
        if GROUP % BLOCK_K == 0 or BLOCK_K % GROUP == 0:
            w = fp4_tile_vec(data_ptr + s * stride_ds, scales_ptr + s * stride_ss, global_scale, k0, offs_n, N, K,
                             stride_dn, stride_sn, GROUP, SCALE_CODE, GLOBAL_OP, BLOCK_N, BLOCK_K)
        else:
            w = fp4_tile(data_ptr + s * stride_ds, scales_ptr + s * stride_ss, global_scale, offs_k, offs_n, N, K,
                         stride_dn, stride_sn, GROUP, SCALE_CODE, GLOBAL_OP)
    return w
