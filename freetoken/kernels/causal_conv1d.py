"""Causal depthwise conv1d over a prompt chunk, continuing a conv state (Gated DeltaNet's short convolution).

Channel c of token t: out[t, c] = silu(sum_j w[c, j] * x'[t + j, c]), where x' = (the state's K - 1 earlier inputs,
then x): a fresh sequence starts from a zero state, which is HF's causal_conv1d_fn (left zero padding); a later
chunk reads the previous chunk's last inputs. The new state is the last K - 1 rows of x'.
"""

from __future__ import annotations

import torch

from freetoken.kernels.checks import check_same_device, check_tensor
from freetoken.kernels.lazy import tl, triton


@triton.jit
def _causal_conv1d_kernel(
    # Pointers
    x_ptr, w_ptr, state_ptr, out_ptr,
    # Dimensions
    T, C,
    # Strides
    stride_x, stride_w, stride_s, stride_out,
    # Meta-parameters
    KW: tl.constexpr, SILU: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """A [BLOCK_T, BLOCK_C] tile of out; taps before position 0 read the state (column KW - 1 + src)."""
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mt, mc = offs_t < T, offs_c < C
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for j in tl.static_range(KW):
        src = offs_t + j - (KW - 1)  # [BT] position in x; < 0: in the state
        in_x = (src >= 0) & mt
        in_state = (src < 0) & mt
        xv = tl.load(x_ptr + src[:, None] * stride_x + offs_c[None, :], mask=in_x[:, None] & mc[None, :], other=0.0)
        sv = tl.load(state_ptr + offs_c[None, :] * stride_s + (KW - 1 + src)[:, None],
                     mask=in_state[:, None] & mc[None, :], other=0.0)
        w = tl.load(w_ptr + offs_c * stride_w + j, mask=mc, other=0.0).to(tl.float32)
        acc += (xv.to(tl.float32) + sv.to(tl.float32)) * w[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(out_ptr + offs_t[:, None] * stride_out + offs_c[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=mt[:, None] & mc[None, :])


def _check(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> None:
    check_tensor(x, "x", 2)
    check_tensor(weight, "weight", 2)
    check_tensor(state, "conv_state", 2, last_contiguous=False)
    check_same_device(x=x, weight=weight, state=state)
    C, KW = weight.shape
    if x.shape[1] != C or tuple(state.shape) != (C, KW - 1):
        raise ValueError(f"x {tuple(x.shape)}, weight {tuple(weight.shape)}, conv_state {tuple(state.shape)}: "
                         f"want x [T, C], weight [C, K], conv_state [C, K - 1]")


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, silu: bool = True) -> torch.Tensor:
    """x [T, C], weight [C, K], state [C, K - 1] (updated in place to the last K - 1 inputs) -> out [T, C]."""
    # 1. check
    _check(x, weight, state)
    T, C = x.shape
    KW = weight.shape[1]
    # 2. allocate
    out = torch.empty_like(x)
    if T == 0:
        return out
    # 3. launch
    BLOCK_T, BLOCK_C = 16, min(triton.next_power_of_2(C), 128)
    grid = (triton.cdiv(T, BLOCK_T), triton.cdiv(C, BLOCK_C))
    _causal_conv1d_kernel[grid](x, weight, state, out, T, C, x.stride(0), weight.stride(0), state.stride(0),
                                out.stride(0), KW=KW, SILU=silu, BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C)
    shift_state(state, x.t())
    return out


def shift_state(state: torch.Tensor, cols: torch.Tensor) -> None:
    """state [..., C, K - 1] <- the last K - 1 columns of (state, cols [..., C, T]), cols joining in the state's
    dtype: the inputs the next chunk's first taps read."""
    if state.shape[-1]:
        state.copy_(torch.cat([state, cols.to(state.dtype)], dim=-1)[..., -state.shape[-1]:])


def causal_conv1d_ref(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, silu: bool = True) -> torch.Tensor:
    """torch: HF's causal_conv1d_fn / causal_conv1d_update (F.conv1d over (state, x) in the weight's dtype, no
    padding), as its K taps summed in fp32 and rounded to that dtype: the same values wherever compared (bf16 products
    are exact in fp32), where bf16 F.conv1d takes 4-40 ms a call on a CPU (1,024-8,192 channels, one token)."""
    _check(x, weight, state)
    T = x.shape[0]
    full = torch.cat([state.to(weight.dtype), x.t().to(weight.dtype)], dim=1).float()  # [C, K - 1 + T]
    out = conv_taps(full, weight, T).t()  # [T, C]
    if silu:
        out = torch.nn.functional.silu(out)
    shift_state(state, x.t())
    return out.to(x.dtype).contiguous()


def conv_taps(full: torch.Tensor, weight: torch.Tensor, T: int) -> torch.Tensor:
    """full [..., C, K - 1 + T] fp32, weight [C, K] -> [..., C, T] in weight's dtype: tap 0 first, then each next
    one added (a depthwise conv's order)."""
    w = weight.float()
    acc = full[..., :T] * w[:, :1]
    for j in range(1, w.shape[1]):
        acc.addcmul_(full[..., j:j + T], w[:, j:j + 1])
    return acc.to(weight.dtype)
