"""One decode step of the causal depthwise conv1d: the new input joins the conv state, which shifts in place.

out[c] = silu(w[c, 0..K-2] . state[c] + w[c, K-1] x[c]); state[c] <- (state[c, 1:], x[c]). HF's
causal_conv1d_update on one token (its state keeps K inputs, the oldest of which its step never reads).

A decode batch steps B sequences at once: x [B, C], each row against its own state, state [B, C, K - 1] (a row per
sequence, stacked by the caller); one sequence is x [1, C] with state [C, K - 1].
"""

from __future__ import annotations

import torch

from freetoken.kernels.checks import check_same_device, check_tensor
from freetoken.kernels.lazy import tl, triton


@triton.jit
def _conv1d_update_kernel(
    # Pointers
    x_ptr, w_ptr, state_ptr, out_ptr,
    # Dimensions
    C,
    # Strides
    stride_xb, stride_w, stride_sb, stride_s, stride_ob,
    # Meta-parameters
    KW: tl.constexpr, SILU: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """BLOCK_C channels of one sequence per program; each program owns its channels' state, so the shift is
    race-free."""
    b = tl.program_id(1)
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    mc = offs_c < C
    x_ptr += b * stride_xb
    state_ptr += b * stride_sb
    out_ptr += b * stride_ob
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


def _batched(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Checks x [B, C], weight [C, K] and state [B, C, K - 1] (or [C, K - 1] with B = 1) -> state as [B, C, K - 1]."""
    check_tensor(x, "x", 2)
    check_tensor(weight, "weight", 2)
    check_same_device(x=x, weight=weight, state=state)
    C, KW = weight.shape
    states = state[None] if state.dim() == 2 else state
    check_tensor(states, "conv_state", 3, last_contiguous=False)
    if x.shape[1] != C or tuple(states.shape) != (x.shape[0], C, KW - 1):
        raise ValueError(f"x {tuple(x.shape)}, weight {tuple(weight.shape)}, conv_state {tuple(state.shape)}: want "
                         "x [B, C] (one token per sequence), weight [C, K], conv_state [B, C, K - 1] (or [C, K - 1] "
                         "for one sequence)")
    return states


def causal_conv1d_update(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, silu: bool = True) -> torch.Tensor:
    """x [B, C] (one token of each of B sequences), weight [C, K], state [B, C, K - 1] ([C, K - 1] when B = 1;
    shifted in place) -> out [B, C]."""
    # 1. check
    states = _batched(x, weight, state)
    B, C = x.shape
    KW = weight.shape[1]
    # 2. allocate
    out = torch.empty((B, C), dtype=x.dtype, device=x.device)
    if B == 0:
        return out
    # 3. launch
    BLOCK_C = min(triton.next_power_of_2(C), 256)
    _conv1d_update_kernel[(triton.cdiv(C, BLOCK_C), B)](
        x, weight, states, out, C, x.stride(0), weight.stride(0), states.stride(0), states.stride(1), out.stride(0),
        KW=KW, SILU=silu, BLOCK_C=BLOCK_C)
    return out


def causal_conv1d_update_ref(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor,
                             silu: bool = True) -> torch.Tensor:
    """torch: the one-token case of causal_conv1d_ref (same taps, same state shift), every sequence at once."""
    from freetoken.kernels.causal_conv1d import conv_taps, shift_state

    states = _batched(x, weight, state)  # [B, C, K - 1]
    full = torch.cat([states.to(weight.dtype), x[:, :, None].to(weight.dtype)], dim=2).float()  # [B, C, K]
    out = conv_taps(full, weight, 1)[:, :, 0]  # [B, C]
    if silu:
        out = torch.nn.functional.silu(out)
    shift_state(states, x[:, :, None])
    return out.to(x.dtype)
