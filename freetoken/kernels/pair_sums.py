"""The expert FFNs' last launch: each token's sum over its (token, k) pair rows and the down GEMM's K splits, plus
up to two more [T, D] terms added after it (the other lane's or the other group's output), each add rounded to the
output dtype as a separate `a + b` would be: the eager adds it replaces, without a kernel of their own.

An FFN called with defer=True stops before this launch and returns a PairSums, so the caller can issue its other
work first (join the CPU lane) and fold the terms in with finish().
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from freetoken.kernels.lazy import tl, triton


@triton.jit
def _sum_pairs_kernel(
    # Pointers
    y_ptr, slot_ptr, out_ptr, a1_ptr, a2_ptr,
    # Dimensions
    K, D, SPLITS,
    # Strides
    stride_ys, stride_yp, stride_st, stride_ot, stride_a1, stride_a2,
    # Meta-parameters
    TERMS: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Program (token, D tile): out[t] = sum of y over the token's resident pairs (others were never written) and
    over the down kernel's K splits, in a fixed order; then + a1[t] (+ a2[t]), rounded to out's dtype before each."""
    t = tl.program_id(0)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for k in range(K):
        width = tl.where(tl.load(slot_ptr + t * stride_st + k) >= 0, D, 0)  # 0: pair not resident, row unwritten
        row = y_ptr + (t * K + k).to(tl.int64) * stride_yp + offs_d
        for s in range(SPLITS):
            acc += tl.load(row + s * stride_ys, mask=offs_d < width, other=0.0)
    mask = offs_d < D
    dtype = out_ptr.dtype.element_ty
    if TERMS >= 1:  # (a term is rounded to out's dtype too, as `a + b` on two out-dtype tensors has it)
        a1 = tl.load(a1_ptr + t * stride_a1 + offs_d, mask=mask).to(dtype).to(tl.float32)
        acc = acc.to(dtype).to(tl.float32) + a1
    if TERMS >= 2:
        a2 = tl.load(a2_ptr + t * stride_a2 + offs_d, mask=mask).to(dtype).to(tl.float32)
        acc = acc.to(dtype).to(tl.float32) + a2
    tl.store(out_ptr + t * stride_ot + offs_d, acc.to(dtype), mask=mask)


def sum_pairs(y: torch.Tensor, slot_ids: torch.Tensor, out: torch.Tensor, terms: tuple[torch.Tensor, ...] = ()
              ) -> torch.Tensor:
    """out [T, D] = each token's sum of its resident pairs' rows of y [splits, T * K, D] over the splits, then
    + terms[0] (+ terms[1]) ([T, D] each, any float dtype: rounded to out's first)."""
    T, K = slot_ids.shape
    D = out.shape[1]
    if len(terms) > 2 or any(tuple(a.shape) != (T, D) or a.stride(1) != 1 for a in terms):
        raise ValueError(f"sum_pairs: at most two [{T}, {D}] row-major terms, got "
                         f"{[tuple(a.shape) for a in terms]}")
    a1, a2 = (tuple(terms) + (out, out))[:2]  # (out: a stand-in, never read)
    BLOCK_D = min(triton.next_power_of_2(D), 1024)
    _sum_pairs_kernel[(T, triton.cdiv(D, BLOCK_D))](
        y, slot_ids, out, a1, a2,
        K, D, y.shape[0],
        y.stride(0), y.stride(1), slot_ids.stride(0), out.stride(0), a1.stride(0), a2.stride(0),
        TERMS=len(terms), BLOCK_D=BLOCK_D, num_warps=4,
    )
    return out


def sum_pairs_ref(y: torch.Tensor, slot_ids: torch.Tensor, out: torch.Tensor, terms: tuple[torch.Tensor, ...] = ()
                  ) -> torch.Tensor:
    """sum_pairs in torch: the pair rows of resident slots summed in fp32 in the kernel's order (pair by pair, split
    by split), then each term added as `a + b` adds."""
    T, K = slot_ids.shape
    acc = torch.zeros(T, y.shape[2])
    for k in range(K):
        resident = (slot_ids[:, k] >= 0).unsqueeze(-1)  # [T, 1]
        for s in range(y.shape[0]):
            acc += torch.where(resident, y[s, k::K].float(), 0.0)  # rows t * K + k
    return add_terms(acc.to(out.dtype), terms)


def add_terms(y: torch.Tensor, terms: tuple[torch.Tensor, ...]) -> torch.Tensor:
    for a in terms:
        y = y + a.to(y.dtype)
    return y


@dataclass(slots=True)
class PairSums:
    """An expert FFN stopped before its last launch (defer=True). finish(*terms) makes its [T, D] output with up to
    two terms added, in order. A kernel set without the split (torch or host kernels) hands back its finished
    output as `done` and adds the terms as tensors."""
    y: torch.Tensor | None = None  # [splits, T * K, D] the down GEMM's per-pair rows
    slot_ids: torch.Tensor | None = None  # [T, K]
    out: torch.Tensor | None = None  # [T, D] where the sum goes
    done: torch.Tensor | None = None  # the output already summed (no launch left)

    def finish(self, *terms: torch.Tensor) -> torch.Tensor:
        if self.done is not None:
            return add_terms(self.done, terms)
        return sum_pairs(self.y, self.slot_ids, self.out, terms)


def deferrable(ffn):
    """An FFN without a split last launch (the torch and host kernel sets) taking defer=True: its output, finished,
    handed back as a PairSums."""
    @functools.wraps(ffn)
    def call(*args, defer: bool = False, **kwargs):
        out = ffn(*args, **kwargs)
        return PairSums(done=out) if defer else out

    return call
