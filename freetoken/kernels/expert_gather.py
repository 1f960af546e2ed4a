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
from freetoken.kernels.tuning import num_sms

_RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # element size -> a raw view dtype


@triton.jit
def _move(src_ptr, dst_ptr, e, s, row, offs):
    """Elements offs (< row) of row e of src into row s of dst."""
    mask = offs < row
    tl.store(dst_ptr + s * row + offs, tl.load(src_ptr + e * row + offs, mask=mask), mask=mask)


@triton.jit
def _move_live(src_ptr, dst_ptr, copy_expert_ptr, copy_slot_ptr, live, row, p, P, BLOCK: tl.constexpr):
    """Work items w = entry * chunks + chunk for the live entries, program p taking every P-th: consecutive programs
    move consecutive blocks of one expert, and an empty copy list costs each program one load."""
    chunks = tl.cdiv(row, BLOCK)
    for w in range(p, live * chunks, P):
        j = w // chunks
        e = tl.load(copy_expert_ptr + j).to(tl.int64)
        s = tl.load(copy_slot_ptr + j).to(tl.int64)
        _move(src_ptr, dst_ptr, e, s, row, (w % chunks) * BLOCK + tl.arange(0, BLOCK))


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
    Grid (P,): a fixed number of programs share the live entries' blocks (a graph replays it whatever the count)."""
    live = tl.load(counts_ptr).to(tl.int32)
    _move_live(src_ptr, dst_ptr, copy_expert_ptr, copy_slot_ptr, live, row, tl.program_id(0), tl.num_programs(0),
               BLOCK)


@triton.jit
def _gather2_kernel(
    # Pointers
    src0_ptr, dst0_ptr, src1_ptr, dst1_ptr, copy_expert_ptr, copy_slot_ptr, counts_ptr,
    # Dimensions
    row0, row1,
    # Meta-parameters
    BLOCK: tl.constexpr,
):
    """_gather_kernel over two expert tensors at once (gate_up and down): grid (P, 2), the last axis picks the
    tensor."""
    live = tl.load(counts_ptr).to(tl.int32)
    p, P = tl.program_id(0), tl.num_programs(0)
    if tl.program_id(1) == 0:
        _move_live(src0_ptr, dst0_ptr, copy_expert_ptr, copy_slot_ptr, live, row0, p, P, BLOCK)
    else:
        _move_live(src1_ptr, dst1_ptr, copy_expert_ptr, copy_slot_ptr, live, row1, p, P, BLOCK)


def gather_programs(n: int, row: int, block: int, device: torch.device) -> int:
    """Programs per expert tensor: enough to keep the PCIe reads in flight (4 per SM), never more than the blocks of
    a full copy list. (The grid used to be one program per block of every possible entry: an empty list in a decode
    graph still ran 12,288 programs per layer, 33 us on an H100.)"""
    work = n * triton.cdiv(row, block)
    if device.type == "cuda":
        return max(1, min(work, 4 * num_sms(device)))
    return max(1, min(work, 4))


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
    grid = (gather_programs(n, row, block, d.device),)
    _gather_kernel[grid](s, d, copy_expert, copy_slot, counts, row, BLOCK=block)


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
        grid = (gather_programs(n, row, b, d0.device), 2)
        _gather2_kernel[grid](s0, d0, s1, d1, copy_expert, copy_slot, counts, d0.shape[1], d1.shape[1], BLOCK=b)
        launches += 1
    return launches


def gather_experts_ref(src: torch.Tensor, dst: torch.Tensor, copy_expert: torch.Tensor, copy_slot: torch.Tensor,
                       counts: torch.Tensor) -> None:
    """The torch reference (syncs: reads the count)."""
    live = int(counts.reshape(-1)[0])
    for e, s in zip(copy_expert[:live].tolist(), copy_slot[:live].tolist()):
        dst[s].copy_(src[e].to(dst.device))
