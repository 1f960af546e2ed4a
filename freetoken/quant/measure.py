"""Slot pools of every expert format allocated for real, and the memory they took measured against the bytes
`cost.expert_bytes` says: the device's allocator on CUDA, the process RSS on CPU (pages zero-filled, so touched).

glibc's malloc would serve a freed pool's successor from its own heap (its mmap threshold grows after each large
free), leaving RSS flat; the threshold is pinned first so every large tensor is its own mmap, returned on free.
"""

from __future__ import annotations

import ctypes
import gc
from dataclasses import dataclass

import torch

from freetoken.quant.config import QuantFormat
from freetoken.quant.cost import describe, expert_bytes
from freetoken.quant.layout import packed_template
from freetoken.quant.specs import FORMAT_SPECS, format_spec

M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
MMAP_THRESHOLD = 128 << 10


@dataclass(frozen=True, slots=True)
class PoolMeasure:
    name: str
    description: str
    bytes_per_expert: int  # expected: gate + up [I, D], down [D, I]
    slots: int
    expected_bytes: int
    measured_bytes: int
    device: str
    method: str

    @property
    def ratio(self) -> float:
        return self.measured_bytes / self.expected_bytes

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__} | {"measured_over_expected": self.ratio}


def formats(extra: QuantFormat | None = None) -> list[tuple[str, QuantFormat | None]]:
    """bf16 (None), every named format, and `extra` (a checkpoint's own) when it is none of them."""
    out: list[tuple[str, QuantFormat | None]] = [("bf16", None)]
    out += [(name, format_spec(name)) for name in FORMAT_SPECS]
    if extra is not None and all(extra != fmt for _, fmt in out):
        out.append(("checkpoint", extra))
    return out


def bytes_per_expert(fmt: QuantFormat | None, hidden: int, intermediate: int) -> int:
    if fmt is None:
        return 3 * hidden * intermediate * 2
    return 2 * expert_bytes(fmt, intermediate, hidden) + expert_bytes(fmt, hidden, intermediate)


def allocate_pool(fmt: QuantFormat | None, hidden: int, intermediate: int, slots: int,
                  device: str) -> list[torch.Tensor]:
    """The zero-filled tensors of a `slots`-expert pool: bf16 [S, 2I, D] + [S, D, I], else one PackedWeight per
    matrix (gate, up, down) from PackedWeight.empty_slots."""
    D, I = hidden, intermediate
    if fmt is None:
        return [torch.zeros((slots, 2 * I, D), dtype=torch.bfloat16, device=device),
                torch.zeros((slots, D, I), dtype=torch.bfloat16, device=device)]
    out = []
    for N, K in ((I, D), (I, D), (D, I)):
        out += packed_template(fmt, N, K).empty_slots(slots, device).tensors().values()
    return out


def _pin_mmap_threshold() -> None:
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    except (OSError, AttributeError):  # not glibc: RSS may then under-report reuse
        pass


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def measure_pool(name: str, fmt: QuantFormat | None, hidden: int, intermediate: int, slots: int,
                 device: str) -> PoolMeasure:
    per_expert = bytes_per_expert(fmt, hidden, intermediate)
    cuda = device.startswith("cuda")
    gc.collect()
    if cuda:
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
    else:
        before = _rss()
    pool = allocate_pool(fmt, hidden, intermediate, slots, device)
    if cuda:
        torch.cuda.synchronize(device)
        measured = torch.cuda.memory_allocated(device) - before
    else:
        measured = _rss() - before
    expected = sum(t.numel() * t.element_size() for t in pool)
    del pool
    gc.collect()
    return PoolMeasure(name, "bf16" if fmt is None else describe(fmt), per_expert, slots, expected, measured, device,
                       "torch.cuda.memory_allocated delta" if cuda else "process RSS delta")


def measure_all(hidden: int, intermediate: int, slots: int, device: str, extra: QuantFormat | None = None,
                on_row=None, pin_malloc: bool = True) -> list[PoolMeasure]:
    """pin_malloc: on CPU, pin glibc's mmap threshold for the rest of the process (what makes RSS deltas honest;
    a process that must keep its malloc tuning passes False and gets RSS figures that may under-report)."""
    if slots <= 0:
        raise ValueError(f"--slots must be positive, got {slots}")
    if not device.startswith("cuda"):
        if pin_malloc:
            _pin_mmap_threshold()
        allocate_pool(None, 64, 64, 1, device)  # first-use allocations of torch itself, outside any measure
    rows = []
    for name, fmt in formats(extra):
        row = measure_pool(name, fmt, hidden, intermediate, slots, device)
        if row.expected_bytes != slots * row.bytes_per_expert:
            raise AssertionError(f"{name}: pool tensors hold {row.expected_bytes} B, cost model says "
                                 f"{slots} x {row.bytes_per_expert}")
        rows.append(row)
        if on_row:
            on_row(row)
    return rows
