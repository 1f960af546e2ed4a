"""Which implementation of the kernel API the engine calls: the Triton kernels, the host kernels, or the torch
references.

- `triton`: the GPU's (compiled on CUDA; on a CPU only interpreted, which tests use);
- `host`: what a CPU-only machine runs: the C kernels built for this CPU (freetoken/host) for expert FFNs over the
  weights as stored, projections of a few rows and decode attention, torch's GEMM in the weights' dtype and SDPA for
  prefill; torch alone where no C compiler is found;
- `reference`: the torch references, everything in fp32 (a checking mode: slower, fp32 copies of what it touches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True, slots=True)
class KernelSet:
    name: str
    rms_norm: Callable
    apply_rope: Callable
    attention: Callable
    router_topk: Callable
    linear: Callable
    expert_ffn: Callable
    expert_ffn_quant: Callable
    # Gated DeltaNet (Qwen3-Next / Qwen3.5 linear-attention layers)
    causal_conv1d: Callable
    causal_conv1d_update: Callable
    gated_delta_chunk: Callable
    gated_delta_step: Callable
    rms_norm_gated: Callable
    # DeepSeek-V4: hash routing, hyper-connections, KV compression, attention over a window and compressed entries
    router_weights: Callable
    hc_pre: Callable
    hc_post: Callable
    hc_head: Callable
    compress_pool: Callable
    attention_compressed: Callable
    # fused: attention's prologue (per-head q / k norm, rope, KV writes), the residual add + RMSNorm, the plain
    # router's projection + top-k, a decode token's add + input norm + qkv projection; None: the unfused calls run
    qk_norm_rope: Callable | None = None
    add_rms_norm: Callable | None = None
    router_linear_topk: Callable | None = None
    add_norm_linear: Callable | None = None


def _build(name: str) -> KernelSet:
    from freetoken import kernels as k

    refs = (k.router_weights_ref, k.hc_pre_ref, k.hc_post_ref, k.hc_head_ref, k.compress_pool_ref,
            k.attention_compressed_ref)  # the host set runs these small or per-sequence ops in torch
    if name == "triton":
        return KernelSet(name, k.rms_norm, k.apply_rope, k.attention, k.router_topk, k.linear, k.expert_ffn,
                         k.expert_ffn_quant, k.causal_conv1d, k.causal_conv1d_update, k.gated_delta_chunk,
                         k.gated_delta_step, k.rms_norm_gated, k.router_weights, k.hc_pre, k.hc_post, k.hc_head,
                         k.compress_pool, k.attention_compressed, qk_norm_rope=k.qk_norm_rope,
                         add_rms_norm=k.add_rms_norm, router_linear_topk=k.router_linear_topk,
                         add_norm_linear=k.add_norm_linear)
    if name == "host":
        from freetoken.host import ops

        return KernelSet(name, ops.rms_norm, ops.apply_rope, ops.attention, ops.router_topk, ops.linear,
                         ops.expert_ffn, ops.expert_ffn_quant, k.causal_conv1d_ref, k.causal_conv1d_update_ref,
                         k.gated_delta_chunk_ref, k.gated_delta_step_ref, k.rms_norm_gated_ref, *refs)
    return KernelSet(name, k.rms_norm_ref, k.apply_rope_ref, k.attention_host, k.router_topk_ref, k.linear_ref,
                     k.expert_ffn_host, k.expert_ffn_quant_host, k.causal_conv1d_ref, k.causal_conv1d_update_ref,
                     k.gated_delta_chunk_ref, k.gated_delta_step_ref, k.rms_norm_gated_ref, *refs,
                     qk_norm_rope=k.qk_norm_rope_ref, add_rms_norm=k.add_rms_norm_ref,
                     router_linear_topk=k.router_linear_topk_ref, add_norm_linear=k.add_norm_linear_ref)


KERNEL_SETS = ("triton", "host", "reference")
KERNEL_CHOICES = ("auto", *KERNEL_SETS)


def resolve_kernels(name: str) -> str:
    """auto: Triton where CUDA is, else the host set (Triton on a CPU only interprets: tens of times slower)."""
    if name not in KERNEL_CHOICES:
        raise ValueError(f"kernels {name!r} is not one of {', '.join(KERNEL_CHOICES)}")
    if name != "auto":
        return name
    import torch

    return "triton" if torch.cuda.is_available() else "host"



def kernel_set(name: str) -> KernelSet:
    return _build(resolve_kernels(name))
