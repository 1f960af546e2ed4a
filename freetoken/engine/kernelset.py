"""Which implementation of the kernel API the engine calls: the Triton kernels, or their torch references.

The device path uses only these functions. The references exist so the many cache-correctness tests can run
fast on CPU while a smaller set runs the Triton kernels (compiled on CUDA, interpreted on CPU).
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


def _build(name: str) -> KernelSet:
    from freetoken import kernels as k

    if name == "triton":
        return KernelSet(name, k.rms_norm, k.apply_rope, k.attention, k.router_topk, k.linear, k.expert_ffn,
                         k.expert_ffn_quant, k.causal_conv1d, k.causal_conv1d_update, k.gated_delta_chunk,
                         k.gated_delta_step, k.rms_norm_gated)
    return KernelSet(name, k.rms_norm_ref, k.apply_rope_ref, k.attention_ref, k.router_topk_ref, k.linear_ref,
                     k.expert_ffn_ref, k.expert_ffn_quant_ref, k.causal_conv1d_ref, k.causal_conv1d_update_ref,
                     k.gated_delta_chunk_ref, k.gated_delta_step_ref, k.rms_norm_gated_ref)


KERNEL_SETS = ("triton", "reference")


def kernel_set(name: str) -> KernelSet:
    if name not in KERNEL_SETS:
        raise ValueError(f"kernels {name!r} is not one of {', '.join(KERNEL_SETS)}")
    return _build(name)
