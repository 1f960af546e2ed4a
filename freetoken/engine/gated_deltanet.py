"""Gated DeltaNet token mixing (Qwen3-Next / Qwen3.5 linear-attention layers) over a sequence's recurrent state.

h -> in_proj_qkv (q, k, v channels) -> causal depthwise conv1d + silu (the conv state holds the last K - 1 inputs)
  -> the gated delta rule (kernels.gated_delta_chunk in prefill, gated_delta_step in decode) with
     beta = sigmoid(h @ W_b), g = -exp(A_log) softplus(h @ W_a + dt_bias), over the state S [Hv, Dk, Dv]
  -> RMSNorm(o) w * silu(h @ W_z) per value head -> out_proj.
Qwen3-Next's packed in_proj_qkvz / in_proj_ba (per key head: q, k, that head's v and z; b then a) are split into
Qwen3.5's four projections at load, so one path runs both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from freetoken.engine.kernelset import KernelSet
from freetoken.models.config import ModelConfig
from freetoken.models.qwen3_next import LINEAR


@dataclass(slots=True)
class DeltaNetWeights:
    w_in: torch.Tensor  # [2 Hk Dk + Hv Dv + Hv Dv + 2 Hv, D]: q, k, v rows, the output gate z, beta and decay-rate
    #                     logits b and a: the four input projections of h in one launch
    conv: torch.Tensor  # [conv_dim, K]
    dt_bias: torch.Tensor  # [Hv] fp32
    neg_a: torch.Tensor  # [Hv] fp32: -exp(A_log)
    norm: torch.Tensor  # [Dv]
    out: torch.Tensor  # [D, Hv Dv]


def _unpack_qwen3_next(cfg: ModelConfig, qkvz: torch.Tensor, ba: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """in_proj_qkvz rows per key head (q Dk, k Dk, v r Dv, z r Dv) and in_proj_ba rows per key head (b r, a r),
    r = Hv / Hk -> (qkv, z, b, a) in Qwen3.5's row order."""
    la = cfg.linear_attention
    Hk, Dk, r = la.num_k_heads, la.k_head_dim, la.num_v_heads // la.num_k_heads
    rv = r * la.v_head_dim
    g = qkvz.view(Hk, 2 * Dk + 2 * rv, -1)
    q, k, v, z = (g[:, lo:hi].reshape(-1, g.shape[-1]) for lo, hi in
                  ((0, Dk), (Dk, 2 * Dk), (2 * Dk, 2 * Dk + rv), (2 * Dk + rv, 2 * Dk + 2 * rv)))
    ba = ba.view(Hk, 2 * r, -1)
    return torch.cat([q, k, v]), z, ba[:, :r].reshape(-1, ba.shape[-1]), ba[:, r:].reshape(-1, ba.shape[-1])


def load_deltanet(cfg: ModelConfig, layer: int, dev: Callable[[str], torch.Tensor]) -> DeltaNetWeights:
    p = LINEAR.format(l=layer)
    if cfg.linear_attention.fused_projections:
        qkv, z, b, a = _unpack_qwen3_next(cfg, dev(p + "in_proj_qkvz.weight"), dev(p + "in_proj_ba.weight"))
    else:
        qkv, z, b, a = (dev(p + n + ".weight") for n in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"))
    return DeltaNetWeights(
        torch.cat([qkv, z, b, a]).contiguous(), dev(p + "conv1d.weight")[:, 0].contiguous(),
        dev(p + "dt_bias").float(), -dev(p + "A_log").float().exp(), dev(p + "norm.weight"), dev(p + "out_proj.weight"))


def deltanet(ks: KernelSet, cfg: ModelConfig, w: DeltaNetWeights, h: torch.Tensor, conv_state: torch.Tensor,
             state: torch.Tensor, batch: bool = False) -> torch.Tensor:
    """h [T, D] -> [T, D]; conv_state [conv_dim, K - 1] and state [Hv, Dk, Dv] fp32 advance by T tokens in place.
    batch: h holds one token of each of B sequences, conv_state [B, conv_dim, K - 1] and state [B, Hv, Dk, Dv]
    their states stacked (a decode batch: the projections run once over the B rows)."""
    la = cfg.linear_attention
    T, Hk, Hv, Dk, Dv = h.shape[0], la.num_k_heads, la.num_v_heads, la.k_head_dim, la.v_head_dim
    C, Z = la.conv_dim, Hv * Dv
    step = batch or T == 1
    mixed, z, b, a = ks.linear(h, w.w_in).split([C, Z, Hv, Hv], dim=1)  # [T, conv_dim], [T, Hv Dv], [T, Hv] x2
    conv = ks.causal_conv1d_update if step else ks.causal_conv1d
    mixed = conv(mixed, w.conv, conv_state)
    q = mixed[:, :la.key_dim].view(T, Hk, Dk)
    k = mixed[:, la.key_dim:2 * la.key_dim].view(T, Hk, Dk)
    v = mixed[:, 2 * la.key_dim:].view(T, Hv, Dv)
    beta = torch.sigmoid(b)  # [T, Hv]
    g = w.neg_a * torch.nn.functional.softplus(a.float() + w.dt_bias)  # [T, Hv] fp32, < 0
    rule = ks.gated_delta_step if step else ks.gated_delta_chunk
    o = rule(q, k, v, g, beta.contiguous(), state)  # [T, Hv, Dv]
    o = ks.rms_norm_gated(o.reshape(T * Hv, Dv), z.reshape(T * Hv, Dv), w.norm, cfg.rms_norm_eps)
    return ks.linear(o.view(T, Hv * Dv), w.out)
