"""One error type for every bad quantized checkpoint: a config field or a tensor, always named."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # config parsing (and the simulator through it) needs no torch
    import torch


class QuantError(ValueError):
    """Bad quantization_config or checkpoint tensor; the message names the field or tensor."""


def require(tensors: dict[str, torch.Tensor], name: str, dtypes: tuple[torch.dtype, ...] | None = None) -> torch.Tensor:
    """Fetch one checkpoint tensor, failing with its full name when missing or of the wrong dtype."""
    if name not in tensors:
        raise QuantError(f"missing tensor {name!r}")
    t = tensors[name]
    if dtypes is not None and t.dtype not in dtypes:
        raise QuantError(f"tensor {name!r}: dtype {t.dtype}, expected one of {[str(d) for d in dtypes]}")
    return t


def check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(expected):
        raise QuantError(f"tensor {name!r}: shape {tuple(t.shape)}, expected {tuple(expected)}")


def as_bytes(name: str, t: torch.Tensor) -> torch.Tensor:
    """Raw bytes of a 1-byte tensor (fp8, e8m0, packed fp4) as uint8: the bits are decoded by hand."""
    if t.element_size() != 1:
        raise QuantError(f"tensor {name!r}: dtype {t.dtype} is not a 1-byte type")
    import torch

    return t.contiguous().view(torch.uint8)
