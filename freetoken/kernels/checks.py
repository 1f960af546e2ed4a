"""Argument checks shared by the kernel wrappers, and the one question every wrapper asks: are we interpreting?"""

from __future__ import annotations

import os

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# Read once, when the package imports its kernels: Triton fixed interpret-or-compile then, for good.
_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0").lower() not in ("", "0", "false", "off", "no")


def interpreting() -> bool:
    """True when the kernels were defined under TRITON_INTERPRET=1 and so run in the CPU interpreter."""
    return _INTERPRETING


def check_tensor(
    t: torch.Tensor,
    name: str,
    ndim: int,
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES,
    last_contiguous: bool = True,
) -> None:
    """Fail with one line naming the argument when a tensor cannot go to a kernel."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: dtype {t.dtype} not in {[str(d) for d in dtypes]}")
    if t.device.type != "cuda" and not interpreting():
        raise ValueError(f"{name}: on {t.device}; CPU tensors run only under TRITON_INTERPRET=1")
    if last_contiguous and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: last dim must be contiguous (stride {t.stride(-1)})")


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        raise ValueError(f"tensors on different devices: {devices}")


def dot_in_fp32(*tensors: torch.Tensor) -> bool:
    """Upcast tl.dot operands to fp32? Yes in the interpreter (its bf16 dot is wrong), for fp32 inputs, and when the
    operands' dtypes differ (tl.dot needs one dtype)."""
    dtypes = {t.dtype for t in tensors}
    return interpreting() or torch.float32 in dtypes or len(dtypes) > 1


def check_linear_args(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> tuple[int, int, int]:
    """x [T, D_in], w [D_out, D_in], bias [D_out] or None, checked once for every linear wrapper -> (T, D_in, D_out)."""
    check_tensor(x, "x", 2)
    check_tensor(w, "w", 2)
    if bias is not None:
        check_tensor(bias, "bias", 1)
    check_same_device(x=x, w=w, bias=bias)
    T, D_in = x.shape
    D_out = w.shape[0]
    if w.shape[1] != D_in:
        raise ValueError(f"w: shape {tuple(w.shape)} does not match x's D_in {D_in}")
    if bias is not None and bias.shape[0] != D_out:
        raise ValueError(f"bias: shape {tuple(bias.shape)} does not match w's D_out {D_out}")
    return T, D_in, D_out
