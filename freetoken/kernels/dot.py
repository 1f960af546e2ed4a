"""One tl.dot for every kernel: fp32 operands where the inputs are fp32 or the interpreter runs (its bf16 dot is wrong)."""

from __future__ import annotations

from freetoken.kernels.lazy import tl, triton


@triton.jit
def mma(a, b, acc, FP32: tl.constexpr):
    """acc += a @ b, accumulated in fp32; FP32 upcasts both operands and asks for full-precision (no tf32) products."""
    if FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)
