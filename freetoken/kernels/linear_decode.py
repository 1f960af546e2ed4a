"""Decode projection y = x @ w.T (+ bias) for a few rows: a split-K GEMV that fills the GPU in one launch.

At batch 1 a projection is a weight read. Narrow ones (k, v, routers: 128-1024 outputs) give a tiled matmul only
4-16 programs, so each program here takes BLOCK_N output rows (as few as 8) and, where that still leaves SMs idle,
a slice of K. Split-K stays one launch and deterministic: every split stores its fp32 partial, bumps its tile's
counter (acq_rel), and the split that arrives last sums the partials in split order, adds the bias, writes the
output and resets the counter for the next launch (or graph replay). Configs come from tuned_configs.json.
"""

from __future__ import annotations

import torch

from freetoken.kernels.checks import check_linear_args
from freetoken.kernels.lazy import tl, triton
from freetoken.kernels.tuning import split_k, tuned

MAX_ROWS = 4  # up to this many rows (decode, small batches) linear() takes this kernel
MAX_SPLIT_TILES = 1024  # output tiles a split launch may have: the counters kept per device and stream
NARROW = 2048  # outputs below this are the "narrow" shape class (k, v, routers), others "wide"
_counters: dict[tuple, torch.Tensor] = {}


@triton.jit(do_not_specialize=["M"])
def _linear_decode_kernel(
    # Pointers
    x_ptr, w_ptr, bias_ptr, out_ptr, partial_ptr, count_ptr,
    # Dimensions
    M, N, K, K_SPLIT,
    # Strides
    stride_xm, stride_wn, stride_om,
    # Meta-parameters
    HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (N tile, split): out[M, tile] = x[M, K] @ w[tile, K].T over its K slice; the last split reduces."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mmask, nmask = offs_m < M, offs_n < N
    k_lo = split * K_SPLIT
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + (k_lo + offs_k)[None, :]  # [BM, BK]
    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + (k_lo + offs_k)[None, :]  # [BN, BK] rows contiguous
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K_SPLIT, BLOCK_K):  # K_SPLIT is a multiple of BLOCK_K; K itself need not be
        kmask = offs_k < K - k_lo - k0
        x = tl.load(x_ptrs, mask=mmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        w = tl.load(w_ptrs, mask=nmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)  # [BM, BN]
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    omask = mmask[:, None] & nmask[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        part_ptrs = partial_ptr + (split * M + offs_m)[:, None] * N + offs_n[None, :]  # [SPLIT_K, M, N] fp32
        tl.store(part_ptrs, acc, mask=omask)
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")  # release our partial, see the others'
        if arrived == SPLIT_K - 1:  # the last split of this tile: sum in split order (deterministic)
            total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in range(SPLIT_K):
                total += tl.load(partial_ptr + (s * M + offs_m)[:, None] * N + offs_n[None, :], mask=omask,
                                 other=0.0, cache_modifier=".cg")  # from L2: other SMs wrote them
            if HAS_BIAS:
                total += tl.load(bias_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=omask)
            tl.atomic_xchg(count_ptr + pid_n, 0)  # ready for the next launch


def shape_class(N: int) -> str:
    return "narrow" if N < NARROW else "wide"


def tile_counters(device: torch.device, stream: "torch.cuda.Stream | None" = None) -> torch.Tensor:
    """Zeroed int32 counters, one buffer per device and stream (kernels on two streams never share a counter; the
    split-K linear and the split router take them in turn on one stream);
    each launch leaves them zero again. A graph's capture stream gets its buffer from reserve_tile_counters before
    the capture begins (an allocation and fill inside a capture would come from the graph's private pool)."""
    if device.type == "cuda":
        stream = stream if stream is not None else torch.cuda.current_stream(device)
    key = (device, stream.cuda_stream if stream is not None else 0)
    if key not in _counters:
        _counters[key] = torch.zeros(MAX_SPLIT_TILES, dtype=torch.int32, device=device)
    return _counters[key]


def reserve_tile_counters(device: torch.device, stream: "torch.cuda.Stream | None" = None) -> torch.Tensor:
    """The counters a launch on `stream` will use, allocated now (call it before capturing on that stream)."""
    return tile_counters(torch.device(device), stream)


def linear_decode(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, D_in] with T <= MAX_ROWS, w [D_out, D_in], bias [D_out] -> [T, D_out] in x's dtype (fp32 accumulate)."""
    # 1. check
    T, D_in, D_out = check_linear_args(x, w, bias)
    if T > MAX_ROWS:
        raise ValueError(f"x: {T} rows; linear_decode takes at most {MAX_ROWS} (use linear)")
    # 2. allocate
    out = torch.empty((T, D_out), dtype=x.dtype, device=x.device)
    if T == 0 or D_out == 0:
        return out
    BM = triton.next_power_of_2(T)
    cfg = tuned("linear_decode", shape_class(D_out), x.device)
    cfg = {**cfg, "BLOCK_K": max(cfg["BLOCK_K"] // BM, 32)}  # the [BM, BN, BK] product keeps one register budget
    BN, BK = cfg["BLOCK_N"], cfg["BLOCK_K"]
    tiles = triton.cdiv(D_out, BN)
    splits, k_split = split_k(tiles, D_in, cfg, x.device) if tiles <= MAX_SPLIT_TILES else (1, D_in)
    if splits == 1:
        k_split = triton.cdiv(D_in, BK) * BK
        partial = counters = out  # never read
    else:
        partial = torch.empty((splits, T, D_out), dtype=torch.float32, device=x.device)
        counters = tile_counters(x.device)
    # 3. launch
    _linear_decode_kernel[(tiles, splits)](
        x, w, bias if bias is not None else w, out, partial, counters,
        T, D_out, D_in, k_split,
        x.stride(0), w.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, SPLIT_K=splits,
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return out


def linear_decode_ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 matmul, rounded once to x's dtype (linear's reference: one definition of the math)."""
    from freetoken.kernels.linear import linear_ref

    return linear_ref(x, w, bias)
