"""Expert gather: copy the experts of a device-side copy list from the host store into their pool slots.

The device placement (kernels/placement.py) leaves its copy list on the device: (expert, slot) pairs and their
count. A host loop of per-expert copies would need that list on the host (a sync per layer); this kernel reads it
where it is, so a decode step, or a CUDA graph of it, issues one launch per expert tensor whatever the misses are.
On CUDA the source is pinned host memory, read by the GPU over PCIe (zero-copy: pinned pages are device-addressable
under unified addressing); on CPU (interpreter) both sides are host tensors. Any dtype: rows move as raw bytes.
"""

from __future__ import annotations

import torch

from freetoken.kernels.lazy import tl, triton

_RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # element size -> a raw view dtype


@triton.jit
def _move(src_ptr, dst_ptr, e, s, row, offs):
    """Elements offs (< row) of row e of src into row s of dst."""
    mask = offs < row
    tl.store(dst_ptr + s * row + offs, tl.load(src_ptr + e * row + offs, mask=mask), mask=mask)


@triton.jit
def _gather_kernel(
    # Pointers
    src_ptr, dst_ptr, copy_expert_ptr, copy_slot_ptr, counts_ptr,
    # Dimensions
    row,
    # Meta-parameters
    BLOCK: tl.constexpr,
):
    """src [E, row], dst [S, row] raw elements; copy_expert / copy_slot [n] int32; counts[0] = live entries.
    Grid (n, cdiv(row, BLOCK)): program (j, c) moves block c of entry j, or nothing when j >= counts[0]."""
    j = tl.program_id(0)
    c = tl.program_id(1)
    live = tl.load(counts_ptr).to(tl.int32)
    if j < live:
        e = tl.load(copy_expert_ptr + j).to(tl.int64)
        s = tl.load(copy_slot_ptr + j).to(tl.int64)
        _move(src_ptr, dst_ptr, e, s, row, c * BLOCK + tl.arange(0, BLOCK))


@triton.jit
def _gather2_kernel(
    # Pointers
    src0_ptr, dst0_ptr, src1_ptr, dst1_ptr, copy_expert_ptr, copy_slot_ptr, counts_ptr,
    # Dimensions
    row0, row1,
    # Meta-parameters
    BLOCK: tl.constexpr,
):
    """_gather_kernel over two expert tensors at once (gate_up and down): grid (n, cdiv(max row, BLOCK), 2), the
    last axis picks the tensor."""
    j = tl.program_id(0)
    c = tl.program_id(1)
    live = tl.load(counts_ptr).to(tl.int32)
    if j < live:
        e = tl.load(copy_expert_ptr + j).to(tl.int64)
        s = tl.load(copy_slot_ptr + j).to(tl.int64)
        offs = c * BLOCK + tl.arange(0, BLOCK)
        if tl.program_id(2) == 0:
            _move(src0_ptr, dst0_ptr, e, s, row0, offs)
        else:
            _move(src1_ptr, dst1_ptr, e, s, row1, offs)


def raw_rows(t: torch.Tensor) -> torch.Tensor:
    """[N, ...] -> [N, row] of a same-size integer dtype (a view; t must be contiguous)."""
    if not t.is_contiguous():
        raise ValueError(f"expert gather: tensor of shape {tuple(t.shape)} is not contiguous")
    return t.view(_RAW[t.element_size()]).reshape(t.shape[0], -1)


def gather_experts(src: torch.Tensor, dst: torch.Tensor, copy_expert: torch.Tensor, copy_slot: torch.Tensor,
                   counts: torch.Tensor, block: int = 4096) -> None:
    """dst[copy_slot[j]] = src[copy_expert[j]] for j < counts[0]. src [E, ...] (host, pinned on CUDA), dst [S, ...]
    (device) of the same per-row shape and dtype; copy_expert / copy_slot int32 [n] and counts int64 on dst's device."""
    if src.dtype != dst.dtype or src.shape[1:] != dst.shape[1:]:
        raise ValueError(f"expert gather: source {src.dtype} {tuple(src.shape)} and pool {dst.dtype} "
                         f"{tuple(dst.shape)} rows differ")
    if copy_expert.dtype != torch.int32 or copy_slot.dtype != torch.int32 or copy_expert.shape != copy_slot.shape:
        raise ValueError("expert gather: copy list must be two int32 [n] tensors")
    s, d = raw_rows(src), raw_rows(dst)
    row = d.shape[1]
    n = copy_expert.numel()
    if n == 0 or row == 0:
        return
    block = min(block, triton.next_power_of_2(row))
    _gather_kernel[(n, triton.cdiv(row, block))](s, d, copy_expert, copy_slot, counts, row, BLOCK=block)


def gather_pairs(pairs: list[tuple[torch.Tensor, torch.Tensor]], copy_expert: torch.Tensor,
                 copy_slot: torch.Tensor, counts: torch.Tensor, block: int = 4096) -> int:
    """gather_experts for each (src, dst) of pairs, two tensors per launch -> the launches issued."""
    launches = 0
    for i in range(0, len(pairs), 2):
        if i + 1 == len(pairs):
            gather_experts(*pairs[i], copy_expert, copy_slot, counts, block)
            launches += 1
            continue
        for src, dst in pairs[i:i + 2]:
            if src.dtype != dst.dtype or src.shape[1:] != dst.shape[1:]:
                raise ValueError(f"expert gather: source {src.dtype} {tuple(src.shape)} and pool {dst.dtype} "
                                 f"{tuple(dst.shape)} rows differ")
        if copy_expert.dtype != torch.int32 or copy_slot.dtype != torch.int32 or copy_expert.shape != copy_slot.shape:
            raise ValueError("expert gather: copy list must be two int32 [n] tensors")
        (s0, d0), (s1, d1) = ((raw_rows(src), raw_rows(dst)) for src, dst in pairs[i:i + 2])
        row = max(d0.shape[1], d1.shape[1])
        n = copy_expert.numel()
        if n == 0 or row == 0:
            continue
        b = min(block, triton.next_power_of_2(row))
        _gather2_kernel[(n, triton.cdiv(row, b), 2)](s0, d0, s1, d1, copy_expert, copy_slot, counts,
                                                     d0.shape[1], d1.shape[1], BLOCK=b)
        launches += 1
    return launches


def gather_experts_ref(src: torch.Tensor, dst: torch.Tensor, copy_expert: torch.Tensor, copy_slot: torch.Tensor,
                       counts: torch.Tensor) -> None:
    """The torch reference (syncs: reads the count)."""
    live = int(counts.reshape(-1)[0])
    for e, s in zip(copy_expert[:live].tolist(), copy_slot[:live].tolist()):
        dst[s].copy_(src[e].to(dst.device))
