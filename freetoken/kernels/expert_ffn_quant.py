"""Fused routed-expert FFN over quantized GPU slots: `expert_ffn` with every weight tile dequantized in registers.

gate / up / down are `PackedWeight`s (freetoken/quant/packed.py) of one kind (int4, fp8, fp4) and S slots. The row
blocks, the SwiGLU epilogue, the routing-weight scaling and the sum over pairs are expert_ffn's (imported, not
copied); only the weight load differs: `packed_tiles.slot_tile` turns the packed bytes and scales of one
[BLOCK_K, BLOCK_N] tile of W.T into fp32. A bf16 / fp16 dot takes the tile rounded to x's dtype, like an unquantized
weight; where the dot runs in fp32 (fp32 x, and the interpreter, whose fp32 -> bf16 cast truncates) it goes in as is.
No full-precision copy of an expert exists at any time: a slot costs exactly its packed bytes in GPU memory.
Biases and the activation (gpt-oss) are expert_ffn's options: plain per-slot tensors beside the PackedWeights.
"""

from __future__ import annotations

import torch

from freetoken.cpu_checks import cpu_only
from freetoken.kernels.checks import check_same_device, check_tensor, dot_in_fp32
from freetoken.kernels.dot import mma
from freetoken.kernels.expert_ffn import (
    _block_rows,
    add_bias,
    bias_args,
    check_ffn_options,
    expert_ffn_ref,
    glu,
    pair_blocks,
)
from freetoken.kernels.lazy import tl, triton
from freetoken.kernels.pair_sums import PairSums, sum_pairs
from freetoken.kernels.packed_tiles import slot_tile
from freetoken.quant.packed import PackedWeight

WEIGHT_NAMES = ("gate", "up", "down")


@triton.jit(do_not_specialize=["TK"])
def _gate_up_quant_kernel(
    # Pointers
    x_ptr, pairs_ptr, block_slot_ptr, slot_ids_ptr, h_ptr, b_ptr,
    g_data_ptr, g_scales_ptr, g_zeros_ptr, g_g_idx_ptr, g_global_ptr,
    u_data_ptr, u_scales_ptr, u_zeros_ptr, u_g_idx_ptr, u_global_ptr,
    # Dimensions
    TK, K, D, I, alpha, limit,
    # Strides (gate and up are both contiguous with one shape: one set)
    stride_xt, stride_hp, stride_bs, stride_ds, stride_dn, stride_ss, stride_sn, stride_zs, stride_zn, stride_gs,
    # Meta-parameters
    ONE_PAIR: tl.constexpr, DOT_FP32: tl.constexpr, HAS_BIAS: tl.constexpr, GLU: tl.constexpr,
    KIND: tl.constexpr, GROUP: tl.constexpr, HAS_G_IDX: tl.constexpr, BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr, SCALE_CODE: tl.constexpr, GLOBAL_OP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (row block, I tile): h[rows, n] = glu(x[tok] @ Wg[s, n].T (+ bg), x[tok] @ Wu[s, n].T (+ bu))."""
    slot, pair, rmask, rows = _block_rows(tl.program_id(0), pairs_ptr, block_slot_ptr, slot_ids_ptr, TK,
                                          BLOCK_M, ONE_PAIR)
    if slot < 0:  # not resident, or past the last resident pair
        return
    tok = pair // K
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + tok[:, None] * stride_xt + offs_k[None, :], mask=rmask[:, None] & (offs_k[None, :] < D),
                    other=0.0)  # [BM, BK]
        wg = slot_tile(g_data_ptr, g_scales_ptr, g_zeros_ptr, g_g_idx_ptr, g_global_ptr, slot, k0, offs_n, I, D,
                       stride_ds, stride_dn, stride_ss, stride_sn, stride_zs, stride_zn, stride_gs,
                       KIND, GROUP, HAS_G_IDX, BLOCK_ROWS, BLOCK_COLS, SCALE_CODE, GLOBAL_OP,
                       BLOCK_N, BLOCK_K)  # [BK, BN]
        if not DOT_FP32:  # a bf16 / fp16 dot: the tile rounded to x's dtype, as an unquantized weight is stored
            wg = wg.to(x.dtype)
        acc_g = mma(x, wg, acc_g, DOT_FP32)
        wu = slot_tile(u_data_ptr, u_scales_ptr, u_zeros_ptr, u_g_idx_ptr, u_global_ptr, slot, k0, offs_n, I, D,
                       stride_ds, stride_dn, stride_ss, stride_sn, stride_zs, stride_zn, stride_gs,
                       KIND, GROUP, HAS_G_IDX, BLOCK_ROWS, BLOCK_COLS, SCALE_CODE, GLOBAL_OP, BLOCK_N, BLOCK_K)
        if not DOT_FP32:
            wu = wu.to(x.dtype)
        acc_u = mma(x, wu, acc_u, DOT_FP32)
    acc_g = add_bias(acc_g, b_ptr, slot, stride_bs, offs_n, I, HAS_BIAS)
    acc_u = add_bias(acc_u, b_ptr + I, slot, stride_bs, offs_n, I, HAS_BIAS)
    h = glu(acc_g, acc_u, GLU, alpha, limit)
    tl.store(h_ptr + rows.to(tl.int64)[:, None] * stride_hp + offs_n[None, :], h.to(h_ptr.dtype.element_ty),
             mask=rmask[:, None] & (offs_n[None, :] < I))


@triton.jit(do_not_specialize=["TK"])
def _down_quant_kernel(
    # Pointers
    h_ptr, pairs_ptr, block_slot_ptr, slot_ids_ptr, route_w_ptr, y_ptr, b_ptr,
    data_ptr, scales_ptr, zeros_ptr, g_idx_ptr, global_ptr,
    # Dimensions
    TK, D, I, K_SPLIT,
    # Strides
    stride_hp, stride_ys, stride_yp, stride_bs, stride_ds, stride_dn, stride_ss, stride_sn, stride_zs, stride_zn,
    stride_gs,
    # Meta-parameters
    ONE_PAIR: tl.constexpr, DOT_FP32: tl.constexpr, HAS_BIAS: tl.constexpr,
    KIND: tl.constexpr, GROUP: tl.constexpr, HAS_G_IDX: tl.constexpr, BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr, SCALE_CODE: tl.constexpr, GLOBAL_OP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (row block, D tile, split): y[split, pair, n] = route_w[pair] * (h[rows, slice] @ Wd[s, n, slice].T
    (+ bd[s, n] on split 0)), the slice the split's K_SPLIT inputs of I (expert_ffn's _down_kernel)."""
    slot, pair, rmask, rows = _block_rows(tl.program_id(0), pairs_ptr, block_slot_ptr, slot_ids_ptr, TK,
                                          BLOCK_M, ONE_PAIR)
    if slot < 0:
        return
    split = tl.program_id(2)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for i in range(0, K_SPLIT, BLOCK_K):
        k0 = split * K_SPLIT + i
        offs_k = k0 + tl.arange(0, BLOCK_K)
        h = tl.load(h_ptr + rows.to(tl.int64)[:, None] * stride_hp + offs_k[None, :],
                    mask=rmask[:, None] & (offs_k[None, :] < I), other=0.0)  # [BM, BK] int64 rows: P * I > 2^31
        w = slot_tile(data_ptr, scales_ptr, zeros_ptr, g_idx_ptr, global_ptr, slot, k0, offs_n, D, I,
                      stride_ds, stride_dn, stride_ss, stride_sn, stride_zs, stride_zn, stride_gs,
                      KIND, GROUP, HAS_G_IDX, BLOCK_ROWS, BLOCK_COLS, SCALE_CODE, GLOBAL_OP, BLOCK_N, BLOCK_K)
        if not DOT_FP32:
            w = w.to(h.dtype)
        acc = mma(h, w, acc, DOT_FP32)
    if split == 0:
        acc = add_bias(acc, b_ptr, slot, stride_bs, offs_n, D, HAS_BIAS)
    route_w = tl.load(route_w_ptr + pair, mask=rmask, other=0.0)  # [BM]
    y_ptrs = y_ptr + split.to(tl.int64) * stride_ys + pair.to(tl.int64)[:, None] * stride_yp + offs_n[None, :]
    tl.store(y_ptrs, acc * route_w[:, None], mask=rmask[:, None] & (offs_n[None, :] < D))


def _layout(w: PackedWeight) -> dict:
    """What the kernel specialises on (gate and up share one launch, so they must agree)."""
    return {"group": w.group, "block": w.block, "scale_code": w.scale_code, "global_op": w.global_op,
                "g_idx": w.g_idx is not None}


def check_packed_experts(gate: PackedWeight, up: PackedWeight, down: PackedWeight, D: int) -> tuple[int, int]:
    """gate / up (I, D) and down (D, I), one kind, one slot count, gate and up one layout -> (S, I)."""
    for name, w in zip(WEIGHT_NAMES, (gate, up, down)):
        if not isinstance(w, PackedWeight):
            raise TypeError(f"{name}: expected a PackedWeight, got {type(w).__name__}")
        w.validate(name)
    I, D_w = gate.shape
    S = gate.num_slots
    if D_w != D:
        raise ValueError(f"gate: shape {tuple(gate.shape)} is (I, D) with D = {D_w}, x has D = {D}")
    for name, w, shape in (("up", up, (I, D)), ("down", down, (D, I))):
        if w.kind != gate.kind:
            raise ValueError(f"{name}: kind {w.kind!r}, gate is {gate.kind!r}: gate, up and down must be one kind")
        if w.num_slots != S:
            raise ValueError(f"{name}: {w.num_slots} slots [S, ...], gate has {S}")
        if tuple(w.shape) != shape:
            raise ValueError(f"{name}: shape {tuple(w.shape)}, expected {shape}")
    if _layout(up) != _layout(gate):
        raise ValueError(f"up: layout {_layout(up)} differs from gate's {_layout(gate)}")
    if S == 0:
        raise ValueError("gate: no slots")
    return S, I


def _kernel_args(w: PackedWeight, name: str) -> tuple[list, list, dict]:
    """(pointers, strides, constexprs) of one PackedWeight; absent tensors are stood in for by data (never read)."""
    for field, t in w.tensors().items():
        if not t.is_contiguous():
            raise ValueError(f"{name}.{field}: must be contiguous (as PackedWeight.empty_slots allocates it)")
    if w.g_idx is not None and w.g_idx.device.type == "cpu" and w.g_idx.numel():
        G = w.scales.shape[2]
        with cpu_only():
            lo, hi = int(w.g_idx.min()), int(w.g_idx.max())
        if not 0 <= lo <= hi < G:
            raise ValueError(f"{name}.g_idx: values must lie in [0, {G}) (checked on CPU only)")
    tensors = [w.data, w.scales, w.zeros, w.g_idx, w.global_scale]
    pointers = [w.data if t is None else t for t in tensors]
    strides = [w.data.stride(0), w.data.stride(1), w.scales.stride(0), w.scales.stride(1)]
    strides += [0, 0] if w.zeros is None else [w.zeros.stride(0), w.zeros.stride(1)]
    strides += [0] if w.g_idx is None else [w.g_idx.stride(0)]
    block = w.block or (1, 1)
    meta = {"KIND": w.kind, "GROUP": w.group, "HAS_G_IDX": w.g_idx is not None, "BLOCK_ROWS": block[0],
            "BLOCK_COLS": block[1], "SCALE_CODE": w.scale_code or "", "GLOBAL_OP": w.global_op or ""}
    return pointers, strides, meta


def expert_ffn_quant(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor,
    gate: PackedWeight, up: PackedWeight, down: PackedWeight,
    b_gate_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None, glu: str = "silu",
    alpha: float = 1.702, limit: float = 7.0, max_experts: int | None = None, defer: bool = False,
) -> torch.Tensor | PairSums:
    """x [T, D], slot_ids [T, K] int32, weights [T, K] fp32, gate / up [S, I, D], down [S, D, I] packed -> [T, D].
    Biases, glu / alpha / limit, max_experts and defer as in expert_ffn."""
    # 1. check
    check_tensor(x, "x", 2)
    check_tensor(slot_ids, "slot_ids", 2, dtypes=(torch.int32,))
    check_tensor(weights, "weights", 2, dtypes=(torch.float32,))
    T, D = x.shape
    K = slot_ids.shape[1]
    if slot_ids.shape[0] != T or tuple(weights.shape) != tuple(slot_ids.shape):
        raise ValueError(f"slot_ids {tuple(slot_ids.shape)} / weights {tuple(weights.shape)} must both be [{T}, K]")
    S, I = check_packed_experts(gate, up, down, D)
    check_ffn_options(b_gate_up, b_down, S, I, D, glu, x.device)
    check_same_device(x=x, slot_ids=slot_ids, weights=weights,
                      **{f"{name}.{field}": t for name, w in zip(WEIGHT_NAMES, (gate, up, down))
                         for field, t in w.tensors().items()})
    gate_ptrs, gu_strides, gu_meta = _kernel_args(gate, "gate")
    up_ptrs, _, _ = _kernel_args(up, "up")  # contiguous with gate's shapes: gate's strides
    down_ptrs, down_strides, down_meta = _kernel_args(down, "down")
    # 2. allocate
    out = torch.empty((T, D), dtype=x.dtype, device=x.device)
    if T == 0 or K == 0:
        return PairSums(done=out.zero_()) if defer else out.zero_()
    slot_ids = slot_ids.contiguous()
    b = pair_blocks(x, slot_ids, weights, S, I, max_experts, kernel="expert_ffn_quant")
    # 3. launch
    dot_fp32 = dot_in_fp32(x)
    b_gu, stride_bgu = bias_args(b_gate_up, x)
    b_d, stride_bd = bias_args(b_down, x)
    _gate_up_quant_kernel[(b.num_blocks, triton.cdiv(I, b.gate_up_block_n))](
        x, b.pairs, b.block_slot, slot_ids, b.h, b_gu, *gate_ptrs, *up_ptrs,
        T * K, K, D, I, float(alpha), float(limit),
        x.stride(0), b.h.stride(0), stride_bgu, *gu_strides,
        ONE_PAIR=b.one_pair, DOT_FP32=dot_fp32, HAS_BIAS=b_gate_up is not None, GLU=glu, **gu_meta,
        BLOCK_M=b.block_m, BLOCK_N=b.gate_up_block_n, BLOCK_K=b.block_k, num_warps=b.num_warps,
        num_stages=b.num_stages,
    )
    _down_quant_kernel[(b.num_blocks, triton.cdiv(D, b.down_block_n), b.splits)](
        b.h, b.pairs, b.block_slot, slot_ids, b.route_w, b.y, b_d, *down_ptrs,
        T * K, D, I, b.k_split,
        b.h.stride(0), b.y.stride(0), b.y.stride(1), stride_bd, *down_strides,
        ONE_PAIR=b.one_pair, DOT_FP32=dot_fp32, HAS_BIAS=b_down is not None, **down_meta,
        BLOCK_M=b.block_m, BLOCK_N=b.down_block_n, BLOCK_K=b.block_k, num_warps=b.num_warps,
        num_stages=b.num_stages,
    )
    return PairSums(b.y, slot_ids, out) if defer else sum_pairs(b.y, slot_ids, out)


def dequantize_experts(gate: PackedWeight, up: PackedWeight, down: PackedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """Every slot through `PackedWeight.to_float` -> (w_gate_up [S, 2I, D], w_down [S, D, I]) in fp32."""
    S = gate.num_slots
    w_gate_up = torch.stack([torch.cat([gate.to_float(s), up.to_float(s)]) for s in range(S)])
    w_down = torch.stack([down.to_float(s) for s in range(S)])
    return w_gate_up, w_down


def expert_ffn_quant_ref(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor,
    gate: PackedWeight, up: PackedWeight, down: PackedWeight, **options,
) -> torch.Tensor:
    """The torch dequantizer, then the unquantized reference: one definition of the math (options: expert_ffn's
    biases and activation)."""
    check_packed_experts(gate, up, down, x.shape[1])
    return expert_ffn_ref(x, slot_ids, weights, *dequantize_experts(gate, up, down), **options)
