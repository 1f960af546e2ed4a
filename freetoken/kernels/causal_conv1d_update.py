"""One decode step of the causal depthwise conv1d: the new input joins the conv state, which shifts in place.

out[c] = silu(w[c, 0..K-2] . state[c] + w[c, K-1] x[c]); state[c] <- (state[c, 1:], x[c]). HF's
causal_conv1d_update on one token (its state keeps K inputs, the oldest of which its step never reads).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from freetoken.kernels.causal_conv1d import _check


@triton.jit
def _conv1d_update_kernel(
    # Pointers
    x_ptr, w_ptr, state_ptr, out_ptr,
    # Dimensions
    C,
    # Strides
    stride_w, stride_s,
    # Meta-parameters
    KW: tl.constexpr, SILU: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """BLOCK_C channels per program; each program owns its channels' state, so the shift is race-free."""
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    mc = offs_c < C
    x = tl.load(x_ptr + offs_c, mask=mc, other=0.0).to(tl.float32)
    acc = x * tl.load(w_ptr + offs_c * stride_w + (KW - 1), mask=mc, other=0.0).to(tl.float32)
    for j in tl.static_range(KW - 1):
        s = tl.load(state_ptr + offs_c * stride_s + j, mask=mc, other=0.0)
        acc += s.to(tl.float32) * tl.load(w_ptr + offs_c * stride_w + j, mask=mc, other=0.0).to(tl.float32)
        if j > 0:
            tl.store(state_ptr + offs_c * stride_s + (j - 1), s, mask=mc)
    if KW > 1:
        tl.store(state_ptr + offs_c * stride_s + (KW - 2), x.to(state_ptr.dtype.element_ty), mask=mc)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(out_ptr + offs_c, acc.to(out_ptr.dtype.element_ty), mask=mc)


def causal_conv1d_update(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, silu: bool = True) -> torch.Tensor:
    """x [1, C] (one token), weight [C, K], state [C, K - 1] (shifted in place) -> out [1, C]."""
    # 1. check
    _check(x, weight, state)
    if x.shape[0] != 1 or not x.is_contiguous():
        raise ValueError(f"x: one contiguous token [1, C] per step, got shape {tuple(x.shape)}")
    C, KW = weight.shape
    # 2. allocate
    out = torch.empty_like(x)
    # 3. launch
    BLOCK_C = min(triton.next_power_of_2(C), 256)
    _conv1d_update_kernel[(triton.cdiv(C, BLOCK_C),)](x, weight, state, out, C, weight.stride(0), state.stride(0),
                                                      KW=KW, SILU=silu, BLOCK_C=BLOCK_C)
    return out


def causal_conv1d_update_ref(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor,
                             silu: bool = True) -> torch.Tensor:
    """torch: the one-token case of causal_conv1d_ref (same state shift)."""
    from freetoken.kernels.causal_conv1d import causal_conv1d_ref

    if x.shape[0] != 1:
        raise ValueError(f"x: one token [1, C] per step, got shape {tuple(x.shape)}")
    return causal_conv1d_ref(x, weight, state, silu)
