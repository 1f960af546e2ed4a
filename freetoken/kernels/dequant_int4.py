"""Int4 weights (GPTQ / AWQ packing) dequantized inside a matmul: y = x @ W.T with W never materialised in full
precision.

`gptq_tile` / `awq_tile` are the building blocks for a quantized expert FFN: each turns the packed int32 words of one
[BLOCK_K, BLOCK_N] tile of W.T into fp32 values in registers, reading the checkpoint tensors as they are stored
(GPTQ: qweight [in/8, out], qzeros [G, out/8], scales [G, out], optional act-order g_idx [in]; AWQ: qweight
[in, out/8] with nibble i of each word holding column 8c + [0,2,4,6,1,3,5,7][i], qzeros likewise).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from freetoken.kernels.checks import check_same_device, check_tensor, dot_in_fp32
from freetoken.kernels.dot import mma

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64


@triton.jit
def gptq_tile(qweight_ptr, qzeros_ptr, scales_ptr, g_idx_ptr, offs_k, offs_n, K, N,
              stride_qw, stride_qz, stride_sc, GROUP: tl.constexpr, ZERO_OFFSET: tl.constexpr,
              HAS_G_IDX: tl.constexpr):
    """fp32 tile [BK, BN] of W.T: w[k, n] = scale[g, n] * (q[k, n] - zero[g, n]), g = g_idx[k] or k // GROUP."""
    mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
    words = tl.load(qweight_ptr + (offs_k[:, None] // 8) * stride_qw + offs_n[None, :], mask=mask, other=0)
    q = (words >> ((offs_k[:, None] % 8) * 4)) & 0xF  # [BK, BN]
    if HAS_G_IDX:
        g = tl.load(g_idx_ptr + offs_k, mask=offs_k < K, other=0)
    else:
        g = offs_k // GROUP
    zwords = tl.load(qzeros_ptr + g[:, None] * stride_qz + offs_n[None, :] // 8, mask=mask, other=0)
    z = ((zwords >> ((offs_n[None, :] % 8) * 4)) & 0xF) + ZERO_OFFSET
    s = tl.load(scales_ptr + g[:, None] * stride_sc + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    return (q - z).to(tl.float32) * s


@triton.jit
def awq_tile(qweight_ptr, qzeros_ptr, scales_ptr, offs_k, offs_n, K, N, stride_qw, stride_qz, stride_sc,
             GROUP: tl.constexpr):
    """fp32 tile [BK, BN] of W.T for AWQ: column n sits in nibble (n % 8) // 2 + 4 * (n % 2) of word n // 8."""
    mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
    shift = (((offs_n % 8) // 2) + 4 * (offs_n % 2)) * 4  # [BN]
    words = tl.load(qweight_ptr + offs_k[:, None] * stride_qw + offs_n[None, :] // 8, mask=mask, other=0)
    q = (words >> shift[None, :]) & 0xF
    g = offs_k // GROUP
    zwords = tl.load(qzeros_ptr + g[:, None] * stride_qz + offs_n[None, :] // 8, mask=mask, other=0)
    z = (zwords >> shift[None, :]) & 0xF
    s = tl.load(scales_ptr + g[:, None] * stride_sc + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    return (q - z).to(tl.float32) * s


@triton.jit(do_not_specialize=["M"])
def _int4_linear_kernel(x_ptr, qweight_ptr, qzeros_ptr, scales_ptr, g_idx_ptr, out_ptr, M, N, K,
                        stride_xm, stride_qw, stride_qz, stride_sc, stride_om,
                        GROUP: tl.constexpr, ZERO_OFFSET: tl.constexpr, HAS_G_IDX: tl.constexpr, AWQ: tl.constexpr,
                        DOT_FP32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :],
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)  # [BM, BK]
        if AWQ:
            w = awq_tile(qweight_ptr, qzeros_ptr, scales_ptr, offs_k, offs_n, K, N, stride_qw, stride_qz, stride_sc,
                         GROUP)  # [BK, BN]
        else:
            w = gptq_tile(qweight_ptr, qzeros_ptr, scales_ptr, g_idx_ptr, offs_k, offs_n, K, N,
                          stride_qw, stride_qz, stride_sc, GROUP, ZERO_OFFSET, HAS_G_IDX)  # [BK, BN]
        acc = mma(x, w.to(x.dtype), acc, DOT_FP32)
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


LAYOUTS = ("gptq", "awq")


def int4_linear(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                group_size: int, zero_offset: int = 1, g_idx: torch.Tensor | None = None,
                layout: str = "gptq") -> torch.Tensor:
    """x [T, in] @ W.T for int4-packed W [out, in] -> [T, out] in x's dtype; zero_offset 1 for v1 `gptq` checkpoints
    (AWQ stores zeros as they are: its zero_offset must be 0)."""
    # 1. check
    check_tensor(x, "x", 2)
    check_tensor(qweight, "qweight", 2, (torch.int32,))
    check_tensor(qzeros, "qzeros", 2, (torch.int32,))
    check_tensor(scales, "scales", 2)
    if layout not in LAYOUTS:
        raise ValueError(f"layout: {layout!r}, valid are {list(LAYOUTS)}")
    awq = layout == "awq"
    if awq and (zero_offset != 0 or g_idx is not None):
        raise ValueError("layout 'awq': zeros are stored as is (zero_offset=0) and there is no g_idx")
    K, N = (qweight.shape[0], qweight.shape[1] * 8) if awq else (qweight.shape[0] * 8, qweight.shape[1])
    if x.shape[1] != K:
        raise ValueError(f"x: {x.shape[1]} input features, qweight {tuple(qweight.shape)} packs {K} ({layout})")
    group = K if group_size == -1 else group_size
    if group <= 0 or K % group:
        raise ValueError(f"group_size: {group_size} does not divide the input dim {K}")
    groups = K // group
    if N % 8 or tuple(qzeros.shape) != (groups, N // 8):
        raise ValueError(f"qzeros: shape {tuple(qzeros.shape)}, expected {(groups, N // 8)}")
    if tuple(scales.shape) != (groups, N):
        raise ValueError(f"scales: shape {tuple(scales.shape)}, expected {(groups, N)}")
    if zero_offset not in (0, 1):
        raise ValueError(f"zero_offset: {zero_offset}, expected 0 (gptq_v2) or 1 (gptq)")
    if g_idx is not None:
        check_tensor(g_idx, "g_idx", 1, (torch.int32,))
        if g_idx.shape[0] != K:
            raise ValueError(f"g_idx: {g_idx.shape[0]} entries, expected {K}")
    check_same_device(x=x, qweight=qweight, qzeros=qzeros, scales=scales, g_idx=g_idx)
    # 2. allocate
    M = x.shape[0]
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    # 3. launch
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    _int4_linear_kernel[grid](
        x, qweight, qzeros, scales, qweight if g_idx is None else g_idx, out, M, N, K,
        x.stride(0), qweight.stride(0), qzeros.stride(0), scales.stride(0), out.stride(0),
        GROUP=group, ZERO_OFFSET=zero_offset, HAS_G_IDX=g_idx is not None, AWQ=awq, DOT_FP32=dot_in_fp32(x, scales),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
    )
    return out


def int4_linear_ref(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                    group_size: int, zero_offset: int = 1, g_idx: torch.Tensor | None = None,
                    layout: str = "gptq") -> torch.Tensor:
    """The same product through freetoken.quant's torch dequantizer, in fp32."""
    from freetoken.quant import DEQUANTIZERS, QuantFormat

    fmt = QuantFormat(layout, layout, 4, group_size, zero_offset=zero_offset, desc_act=g_idx is not None,
                      names=(("qweight", "qweight"), ("qzeros", "qzeros"), ("scales", "scales"), ("g_idx", "g_idx")))
    tensors = {"w.qweight": qweight, "w.qzeros": qzeros, "w.scales": scales}
    if g_idx is not None:
        tensors["w.g_idx"] = g_idx
    w = DEQUANTIZERS[layout](tensors, "w", fmt)  # [out, in]
    return (x.float() @ w.t()).to(x.dtype)
