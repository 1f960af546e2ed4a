"""Dense experts of a prefill-sized call through torch's grouped GEMM (torch._grouped_mm, the call HF transformers runs
its experts with): one call per projection over the (token, pick) pairs sorted by expert, in the weights' dtype
(gate / up, and SiLU(gate) * up, in that dtype as HF computes them; other activations in fp32), the routing weights
and the sum in fp32. Below about GEMM_TOKENS_PER_EXPERT tokens per expert the C kernels win (they read each weight
row once for all its tokens).

Each expert's rows are padded to a multiple of ROW_MULTIPLE (its first pair repeated, routing weight 0). torch runs
a bf16 group as a oneDNN matmul, and oneDNN JIT-builds and caches one primitive per shape: unpadded, nearly every
expert of every call is a shape not seen before, and the process keeps each one (~0.3 MB). Measured on `ft bench
cpu`'s random qwen3_moe (hidden 1024, 64 experts top-8, 512-token prompt, 1 thread): prefill 388 -> 427 tok/s, peak
RSS of `ft generate --cpu-moe` 2.76 -> 2.59 GB, and 4 prompts in one process no longer add 0.28 GB."""

from __future__ import annotations

import numpy as np
import torch

from freetoken.kernels.expert_ffn import glu_ref

# measured (1 thread, bf16, Qwen3-30B-A3B's expert shape): the C kernel 99 / torch 109 GFLOP/s at 32 tokens per
# expert, 119 / 161 at 128; below 32 the C kernel wins (docs/host.md)
GEMM_TOKENS_PER_EXPERT = 64
ROW_MULTIPLE = 16  # measured as 8 (as fast, 2% more memory) and 32 (4% slower); 1 is unpadded


def available() -> bool:
    return hasattr(torch, "_grouped_mm")


def half_gemm_fast() -> bool:
    """Whether torch multiplies bf16 / fp16 matrices on this CPU at GEMM speed (oneDNN with AVX512-BF16 or AMX). On
    AVX2-only CPUs it falls back to a dot product per output (8.8 GFLOP/s at 512 x 1024 x 3072 on a Zen 3 core,
    fp32 57): there the C kernels take the experts and dense projections run in fp32."""
    if _HALF_FAST[0] is None:
        mkldnn = getattr(torch.ops, "mkldnn", None)
        try:
            _HALF_FAST[0] = bool(mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            _HALF_FAST[0] = False
    return _HALF_FAST[0]


_HALF_FAST: list[bool | None] = [None]


def gemm_sized(ids: np.ndarray, take: np.ndarray | None, num_experts: int, dtype: torch.dtype) -> bool:
    """A long prefill chunk: its experts average enough tokens each that the blocked GEMM wins (where torch's GEMM in
    the weights' dtype is fast: fp32 always, half types per half_gemm_fast)."""
    if ids.size < GEMM_TOKENS_PER_EXPERT or not (dtype == torch.float32 or half_gemm_fast()):
        return False
    routed = ids[(ids >= 0) & (ids < num_experts)]
    if take is not None:
        routed = routed[np.asarray(take, bool)[routed]]
    active = np.count_nonzero(np.bincount(routed, minlength=num_experts))
    return active > 0 and routed.size >= GEMM_TOKENS_PER_EXPERT * active


def grouped_experts(x: torch.Tensor, ids: np.ndarray, weights: torch.Tensor, gate_up: torch.Tensor,
                    down: torch.Tensor, take: np.ndarray | None = None, b_gate_up: torch.Tensor | None = None,
                    b_down: torch.Tensor | None = None, glu: dict | None = None) -> torch.Tensor:
    """x [T, D], ids [T, K] (ids outside [0, E) or not in `take` skipped), weights [T, K], gate_up [E, 2I, D] (gate
    rows, then up rows), down [E, D, I], biases [E, 2I] / [E, D] -> fp32 [T, D]."""
    T, K = ids.shape
    E, I, dt = gate_up.shape[0], down.shape[2], gate_up.dtype
    flat = ids.reshape(-1)
    valid = (flat >= 0) & (flat < E)
    if take is not None:
        valid[valid] = np.asarray(take, bool)[flat[valid]]
    pairs = np.flatnonzero(valid)
    order = pairs[np.argsort(flat[pairs], kind="stable")]  # [S] by expert, token order inside
    rows, real, ends = padded_rows(order, flat[order], E)  # [P] pairs, [S] their rows, [E] end of each expert's
    experts = torch.from_numpy(np.repeat(np.arange(E), np.diff(ends, prepend=0)))  # [P]
    offs = torch.from_numpy(ends.astype(np.int32))
    tok = torch.from_numpy(rows // K)
    h = torch._grouped_mm(x[tok].to(dt), gate_up.transpose(-2, -1), offs=offs)  # [P, 2I]
    if b_gate_up is not None:
        h = h + b_gate_up[experts].to(dt)
    if (glu or {}).get("glu", "silu") == "silu":  # in the weights' dtype, as HF's experts compute it
        h = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
    else:
        h = glu_ref(h[:, :I].float(), h[:, I:].float(), **glu).to(dt)
    y = torch._grouped_mm(h, down.transpose(-2, -1), offs=offs)  # [P, D]
    if b_down is not None:
        y = y + b_down[experts].to(dt)
    route = torch.zeros(rows.size, dtype=torch.float32)  # [P] padding rows weigh 0
    route[torch.from_numpy(real)] = weights.reshape(-1)[torch.from_numpy(order)].float()
    out = torch.zeros((T, down.shape[1]), dtype=torch.float32)
    # widened once, then scaled in place: the values of a mixed-dtype product, ~1% less prefill time (measured)
    return out.index_add_(0, tok, y.float().mul_(route[:, None]))


def padded_rows(order: np.ndarray, experts: np.ndarray, num_experts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """order [S] pairs sorted by expert, experts [S] theirs -> (rows [P]: each expert's pairs, then its first pair
    repeated up to a multiple of ROW_MULTIPLE; real [S]: the row of each pair; ends [E] int64: each expert's end)."""
    counts = np.bincount(experts, minlength=num_experts)  # [E]
    padded = -(-counts // ROW_MULTIPLE) * ROW_MULTIPLE
    ends = np.cumsum(padded)
    starts, firsts = ends - padded, np.cumsum(counts) - counts
    real = starts[experts] + np.arange(order.size) - firsts[experts]
    first = order[np.minimum(firsts, order.size - 1)] if order.size else np.zeros(num_experts, order.dtype)
    rows = np.repeat(first, padded)  # (an expert without pairs repeats none)
    rows[real] = order
    return rows, real, ends
