"""Fused routed-expert FFN over GPU slot ids: out[t] = sum_k w[t,k] * down_s(silu(gate_s x[t]) * up_s x[t]).

Three launches: a gate/up GEMM with a fused silu*mul epilogue, a down GEMM scaled by the routing weight into a
per-pair buffer, a sum over each token's K pairs. Rows come in blocks of BLOCK_M (token, k) pairs sharing one slot:
- prefill: pairs grouped by slot and padded to BLOCK_M (moe_align.py); pairs with slot -1 (not resident, computed
  elsewhere) are dropped there, and blocks past the padded total carry slot -1;
- decode (few pairs): block b is pair b with slot slot_ids[b], no grouping glue at all.
Either way a block whose slot is -1 takes the one early return.

Options (gpt-oss): per-slot biases b_gate_up [S, 2I] (gate then up) and b_down [S, D], added before the activation
and before the routing weight; `glu` picks the gated activation of GLUS (constexpr in the kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from freetoken.cpu_checks import cpu_only
from freetoken.kernels.checks import check_same_device, check_tensor, dot_in_fp32
from freetoken.kernels.dot import mma
from freetoken.kernels.lazy import tl, triton
from freetoken.kernels.moe_align import align_by_slot
from freetoken.kernels.pair_sums import PairSums, sum_pairs
from freetoken.kernels.tuning import split_k, tuned

MAX_PAIRS_ONE_PER_BLOCK = 16  # up to this many (token, k) pairs, each pair is its own block (decode)
# silu: SwiGLU silu(g) * u; clamped (gpt-oss): g = min(g, limit), u = clamp(u, -limit, limit), g sigmoid(alpha g) (u + 1)
GLUS = ("silu", "clamped", "silu_limit")  # silu_limit: DeepSeek-V4 (silu of the clamped gate x the clamped up)


@triton.jit
def glu(gate, up, GLU: tl.constexpr, alpha, limit):
    """The gated activation of gate and up in fp32 (GLUS)."""
    if GLU == "clamped":
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        return gate * tl.sigmoid(gate * alpha) * (up + 1.0)
    elif GLU == "silu_limit":
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        return gate * tl.sigmoid(gate) * up
    else:
        return gate * tl.sigmoid(gate) * up


@triton.jit
def add_bias(acc, b_ptr, slot, stride_bs, offs_n, N, HAS_BIAS: tl.constexpr):
    """acc [BM, BN] + bias[slot, offs_n] (a no-op without HAS_BIAS)."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + slot.to(tl.int64) * stride_bs + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def _block_rows(b, pairs_ptr, block_slot_ptr, slot_ids_ptr, TK, BLOCK_M: tl.constexpr, ONE_PAIR: tl.constexpr):
    """Row block b -> (slot, pair ids [BM], real-row mask [BM], rows of the h buffer [BM])."""
    offs = tl.arange(0, BLOCK_M)
    if ONE_PAIR:
        slot = tl.load(slot_ids_ptr + b)
        pair = b + offs * 0
        return slot, pair, offs == 0, pair
    else:
        rows = b * BLOCK_M + offs
        pair = tl.load(pairs_ptr + rows)  # TK = padding
        return tl.load(block_slot_ptr + b), pair, pair < TK, rows


@triton.jit(do_not_specialize=["TK"])
def _gate_up_kernel(
    # Pointers
    x_ptr, w_ptr, pairs_ptr, block_slot_ptr, slot_ids_ptr, h_ptr, b_ptr,
    # Dimensions
    TK, K, D, I, alpha, limit,
    # Strides
    stride_xt, stride_ws, stride_wn, stride_hp, stride_bs,
    # Meta-parameters
    ONE_PAIR: tl.constexpr, DOT_FP32: tl.constexpr, HAS_BIAS: tl.constexpr, GLU: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (row block, I tile): h[rows, n] = glu(x[tok] @ Wg[s, n].T (+ bg), x[tok] @ Wu[s, n].T (+ bu))."""
    slot, pair, rmask, rows = _block_rows(tl.program_id(0), pairs_ptr, block_slot_ptr, slot_ids_ptr, TK,
                                          BLOCK_M, ONE_PAIR)
    if slot < 0:  # not resident, or past the last resident pair
        return
    tok = pair // K
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < I
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + tok[:, None] * stride_xt + offs_k[None, :]  # [BM, BK]
    g_ptrs = w_ptr + slot.to(tl.int64) * stride_ws + offs_n[None, :] * stride_wn + offs_k[:, None]  # [BK, BN]
    u_ptrs = g_ptrs + I * stride_wn
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        kmask = offs_k < D - k0
        x = tl.load(x_ptrs, mask=rmask[:, None] & kmask[None, :], other=0.0)
        wmask = kmask[:, None] & nmask[None, :]
        acc_g = mma(x, tl.load(g_ptrs, mask=wmask, other=0.0), acc_g, DOT_FP32)
        acc_u = mma(x, tl.load(u_ptrs, mask=wmask, other=0.0), acc_u, DOT_FP32)
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    acc_g = add_bias(acc_g, b_ptr, slot, stride_bs, offs_n, I, HAS_BIAS)
    acc_u = add_bias(acc_u, b_ptr + I, slot, stride_bs, offs_n, I, HAS_BIAS)
    h = glu(acc_g, acc_u, GLU, alpha, limit)
    tl.store(h_ptr + rows.to(tl.int64)[:, None] * stride_hp + offs_n[None, :], h.to(h_ptr.dtype.element_ty),
             mask=rmask[:, None] & nmask[None, :])


@triton.jit(do_not_specialize=["TK"])
def _down_kernel(
    # Pointers
    h_ptr, w_ptr, pairs_ptr, block_slot_ptr, slot_ids_ptr, route_w_ptr, y_ptr, b_ptr,
    # Dimensions
    TK, D, I, K_SPLIT,
    # Strides
    stride_hp, stride_ws, stride_wn, stride_ys, stride_yp, stride_bs,
    # Meta-parameters
    ONE_PAIR: tl.constexpr, DOT_FP32: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (row block, D tile, split): y[split, pair, n] = route_w[pair] * (h[rows, slice] @ Wd[s, n, slice].T
    (+ bd[s, n] on split 0)) over the split's K_SPLIT-wide slice of I (one split: all of I)."""
    slot, pair, rmask, rows = _block_rows(tl.program_id(0), pairs_ptr, block_slot_ptr, slot_ids_ptr, TK,
                                          BLOCK_M, ONE_PAIR)
    if slot < 0:
        return
    split = tl.program_id(2)
    k_lo = split * K_SPLIT
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < D
    offs_k = tl.arange(0, BLOCK_K)
    h_ptrs = h_ptr + rows.to(tl.int64)[:, None] * stride_hp + (k_lo + offs_k)[None, :]  # [BM, BK] int64: P * I > 2^31
    w_ptrs = w_ptr + slot.to(tl.int64) * stride_ws + offs_n[None, :] * stride_wn + (k_lo + offs_k)[:, None]  # [BK, BN]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K_SPLIT, BLOCK_K):  # K_SPLIT: a multiple of BLOCK_K; the last split may end early
        kmask = offs_k < I - k_lo - k0
        h = tl.load(h_ptrs, mask=rmask[:, None] & kmask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=kmask[:, None] & nmask[None, :], other=0.0)
        acc = mma(h, w, acc, DOT_FP32)
        h_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if split == 0:
        acc = add_bias(acc, b_ptr, slot, stride_bs, offs_n, D, HAS_BIAS)
    route_w = tl.load(route_w_ptr + pair, mask=rmask, other=0.0)  # [BM]
    y_ptrs = y_ptr + split.to(tl.int64) * stride_ys + pair.to(tl.int64)[:, None] * stride_yp + offs_n[None, :]
    tl.store(y_ptrs, acc * route_w[:, None], mask=rmask[:, None] & nmask[None, :])


def check_ffn_options(b_gate_up: torch.Tensor | None, b_down: torch.Tensor | None, S: int, I: int, D: int,
                      glu: str, device: torch.device) -> None:
    """Biases [S, 2I] / [S, D] on x's device, a known activation (shared by expert_ffn and expert_ffn_quant)."""
    if glu not in GLUS:
        raise ValueError(f"glu: unknown {glu!r}; valid: {', '.join(GLUS)}")
    for name, b, shape in (("b_gate_up", b_gate_up, (S, 2 * I)), ("b_down", b_down, (S, D))):
        if b is None:
            continue
        check_tensor(b, name, 2)
        if tuple(b.shape) != shape:
            raise ValueError(f"{name}: shape {tuple(b.shape)} is not {list(shape)}")
        if b.device != device:
            raise ValueError(f"{name}: on {b.device}, x on {device}")


@dataclass(slots=True)
class PairBlocks:
    """How both expert FFNs (dense and packed) walk a call's (token, k) pairs, the tiles they launch, and the
    buffers they fill."""

    one_pair: bool  # decode: block b is pair b
    block_m: int
    pairs: torch.Tensor  # [rows] pair ids grouped by slot (prefill), else slot_ids (unused)
    block_slot: torch.Tensor  # [blocks] slot of each row block (prefill), else slot_ids (unused)
    num_blocks: int
    h: torch.Tensor  # [rows, I] gated activation per row
    y: torch.Tensor  # [splits, T * K, D] fp32 weighted expert output per pair and K split of the down GEMM
    route_w: torch.Tensor  # [T * K] routing weight per pair
    gate_up_block_n: int
    down_block_n: int
    block_k: int
    k_split: int  # the down kernel's slice of I per split (a multiple of block_k)
    num_warps: int
    num_stages: int

    @property
    def splits(self) -> int:
        return self.y.shape[0]


PREFILL_TILES = {"GATE_UP_BLOCK_N": 64, "DOWN_BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3}


def pair_blocks(x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, S: int, I: int,
                max_experts: int | None = None, kernel: str = "expert_ffn") -> PairBlocks:
    """Check slot ids (CPU only), lay out the row blocks, pick the tiles (decode: `kernel`_decode's tuned config,
    the down GEMM split over I until the call fills the GPU), allocate h / y."""
    if x.device.type == "cpu" and slot_ids.numel():
        with cpu_only():
            lo, hi = int(slot_ids.min()), int(slot_ids.max())
        if not -1 <= lo <= hi < S:
            raise ValueError(f"slot_ids: values must lie in [-1, {S}) (checked on CPU only: on a GPU it would sync)")
    T, K = slot_ids.shape
    D = x.shape[1]
    one_pair = T * K <= MAX_PAIRS_ONE_PER_BLOCK
    block_m = 16 if T <= 32 else 64
    if one_pair:
        pairs = block_slot = slot_ids  # unused by the kernels in this mode
        num_blocks = num_rows = T * K
        cfg = tuned(f"{kernel}_decode", "any", x.device)
        splits, k_split = split_k(num_blocks * triton.cdiv(D, cfg["DOWN_BLOCK_N"]), I, cfg, x.device)
    else:
        blocks = align_by_slot(slot_ids, S, block_m, max_experts)
        pairs, block_slot = blocks.pairs, blocks.block_slot
        num_blocks, num_rows = block_slot.shape[0], pairs.shape[0]
        cfg = PREFILL_TILES
        splits, k_split = 1, triton.cdiv(I, cfg["BLOCK_K"]) * cfg["BLOCK_K"]
    h = torch.empty((num_rows, I), dtype=x.dtype, device=x.device)
    y = torch.empty((splits, T * K, D), dtype=torch.float32, device=x.device)
    return PairBlocks(one_pair, block_m, pairs, block_slot, num_blocks, h, y, weights.contiguous().reshape(-1),
                      cfg["GATE_UP_BLOCK_N"], cfg["DOWN_BLOCK_N"], cfg["BLOCK_K"], k_split, cfg["num_warps"],
                      cfg["num_stages"])


def bias_args(b: torch.Tensor | None, stand_in: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(pointer, slot stride) of an optional bias; without one the stand-in is passed and never read."""
    return (stand_in, 0) if b is None else (b, b.stride(0))


def expert_ffn(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
    b_gate_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None, glu: str = "silu",
    alpha: float = 1.702, limit: float = 7.0, max_experts: int | None = None, defer: bool = False,
) -> torch.Tensor | PairSums:
    """x [T, D], slot_ids [T, K] int32, weights [T, K] fp32, w_gate_up [S, 2I, D], w_down [S, D, I] -> [T, D].
    Optional b_gate_up [S, 2I], b_down [S, D]; glu of GLUS (alpha, limit: the clamped one's gain and clamp);
    max_experts: distinct slots one call can use (the layer's E), bounding prefill's padded rows. defer: stop
    before the sum over pairs and return a PairSums (finish() adds terms in that launch)."""
    # 1. check
    check_tensor(x, "x", 2)
    check_tensor(slot_ids, "slot_ids", 2, dtypes=(torch.int32,))
    check_tensor(weights, "weights", 2, dtypes=(torch.float32,))
    check_tensor(w_gate_up, "w_gate_up", 3)
    check_tensor(w_down, "w_down", 3)
    check_same_device(x=x, slot_ids=slot_ids, weights=weights, w_gate_up=w_gate_up, w_down=w_down)
    T, D = x.shape
    S, I2, D_w = w_gate_up.shape
    I = I2 // 2
    K = slot_ids.shape[1]
    if slot_ids.shape[0] != T or tuple(weights.shape) != tuple(slot_ids.shape):
        raise ValueError(f"slot_ids {tuple(slot_ids.shape)} / weights {tuple(weights.shape)} must both be [{T}, K]")
    if D_w != D or I2 % 2:
        raise ValueError(f"w_gate_up: shape {tuple(w_gate_up.shape)} is not [S, 2*I, {D}]")
    if tuple(w_down.shape) != (S, D, I):
        raise ValueError(f"w_down: shape {tuple(w_down.shape)} is not [{S}, {D}, {I}]")
    if w_gate_up.stride(1) != D or w_down.stride(1) != I:
        raise ValueError("w_gate_up / w_down: each slot's matrix must be row-major contiguous")
    if S == 0:
        raise ValueError("w_gate_up: no slots")
    check_ffn_options(b_gate_up, b_down, S, I, D, glu, x.device)
    # 2. allocate
    out = torch.empty((T, D), dtype=x.dtype, device=x.device)
    if T == 0 or K == 0:
        return PairSums(done=out.zero_()) if defer else out.zero_()
    slot_ids = slot_ids.contiguous()
    b = pair_blocks(x, slot_ids, weights, S, I, max_experts)
    # 3. launch
    dot_fp32 = dot_in_fp32(x, w_gate_up, w_down)
    b_gu, stride_bgu = bias_args(b_gate_up, x)
    b_d, stride_bd = bias_args(b_down, x)
    _gate_up_kernel[(b.num_blocks, triton.cdiv(I, b.gate_up_block_n))](
        x, w_gate_up, b.pairs, b.block_slot, slot_ids, b.h, b_gu,
        T * K, K, D, I, float(alpha), float(limit),
        x.stride(0), w_gate_up.stride(0), w_gate_up.stride(1), b.h.stride(0), stride_bgu,
        ONE_PAIR=b.one_pair, DOT_FP32=dot_fp32, HAS_BIAS=b_gate_up is not None, GLU=glu,
        BLOCK_M=b.block_m, BLOCK_N=b.gate_up_block_n, BLOCK_K=b.block_k, num_warps=b.num_warps,
        num_stages=b.num_stages,
    )
    _down_kernel[(b.num_blocks, triton.cdiv(D, b.down_block_n), b.splits)](
        b.h, w_down, b.pairs, b.block_slot, slot_ids, b.route_w, b.y, b_d,
        T * K, D, I, b.k_split,
        b.h.stride(0), w_down.stride(0), w_down.stride(1), b.y.stride(0), b.y.stride(1), stride_bd,
        ONE_PAIR=b.one_pair, DOT_FP32=dot_fp32, HAS_BIAS=b_down is not None,
        BLOCK_M=b.block_m, BLOCK_N=b.down_block_n, BLOCK_K=b.block_k, num_warps=b.num_warps,
        num_stages=b.num_stages,
    )
    return PairSums(b.y, slot_ids, out) if defer else sum_pairs(b.y, slot_ids, out)


def glu_ref(gate: torch.Tensor, up: torch.Tensor, glu: str = "silu", alpha: float = 1.702,
            limit: float = 7.0) -> torch.Tensor:
    """The gated activation in torch (GLUS): the references' and the engine's CPU lane's."""
    if glu == "clamped":
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        return gate * torch.sigmoid(gate * alpha) * (up + 1)
    if glu == "silu_limit":
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    elif glu != "silu":
        raise ValueError(f"glu: unknown {glu!r}; valid: {', '.join(GLUS)}")
    return torch.nn.functional.silu(gate) * up


def expert_ffn_ref(
    x: torch.Tensor, slot_ids: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
    b_gate_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None, glu: str = "silu",
    alpha: float = 1.702, limit: float = 7.0, max_experts: int | None = None,
) -> torch.Tensor:
    """gpt-fast style: gather each pair's slot weights, einsum in fp32, zero weight where the slot is -1.
    (max_experts: the kernel's padding bound; nothing is padded here.)"""
    # T = tokens, K = picks, D = hidden, I = expert intermediate
    I = w_down.shape[2]
    resident = slot_ids >= 0  # [T, K]
    slots = slot_ids.clamp(min=0).long()
    w_gu = w_gate_up[slots].float()  # [T, K, 2I, D]
    gate_up = torch.einsum("td,tkhd->tkh", x.float(), w_gu)  # [T, K, 2I]
    if b_gate_up is not None:
        gate_up = gate_up + b_gate_up[slots].float()
    h = glu_ref(gate_up[..., :I], gate_up[..., I:], glu, alpha, limit)  # [T, K, I]
    y = torch.einsum("tki,tkdi->tkd", h, w_down[slots].float())  # [T, K, D]
    if b_down is not None:
        y = y + b_down[slots].float()
    scale = torch.where(resident, weights.float(), 0.0)  # [T, K]
    return torch.einsum("tkd,tk->td", y, scale).to(x.dtype)
