"""Comparison tolerances for kernel-vs-reference tests.

fp32: both sides accumulate in fp32, only the summation order differs -> 1e-5 relative.
bf16/fp16: the kernel rounds its output (and, like HF, some intermediates: softmax probabilities before P @ V,
the SwiGLU activation before the down projection) to the 8-bit (bf16) mantissa; the reference rounds only its output.
A few ulps of bf16 (2^-8 = 0.4 %) -> 2e-2 relative and absolute on O(1) values.
"""

from __future__ import annotations

import torch

TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
    torch.float16: dict(rtol=5e-3, atol=5e-3),
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    """Compare in fp32 with the tolerance of `dtype` (default: the expected tensor's dtype)."""
    tol = TOL[dtype or expected.dtype]
    torch.testing.assert_close(actual.float(), expected.float(), **tol)
