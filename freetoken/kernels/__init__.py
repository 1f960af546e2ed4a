"""Triton kernels of the live engine. Each module holds the kernel, its wrapper (check, allocate, launch) and a torch
reference `<name>_ref`.

On a machine without CUDA the kernels can only run in Triton's interpreter, and Triton decides between compiling and
interpreting when it builds each kernel (it reads TRITON_INTERPRET then: at the kernel's first launch, lazy.py).
This package is imported before any kernel module is, so setting TRITON_INTERPRET=1 here makes CPU machines
interpret every kernel on CPU tensors. An explicit TRITON_INTERPRET (0 or 1) is left as the user set it. Triton
itself is imported only when a kernel is first launched (lazy.py): the CPU engine never imports it.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"

from freetoken.kernels.attention import attention, attention_ref  # noqa: E402
from freetoken.kernels.attention_compressed import attention_compressed, attention_compressed_ref  # noqa: E402
from freetoken.kernels.compress_pool import compress_pool, compress_pool_ref  # noqa: E402
from freetoken.kernels.hyper_connection import (hc_head, hc_head_ref, hc_post, hc_post_ref, hc_pre,  # noqa: E402
                                                hc_pre_ref)
from freetoken.kernels.causal_conv1d import causal_conv1d, causal_conv1d_ref  # noqa: E402
from freetoken.kernels.causal_conv1d_update import causal_conv1d_update, causal_conv1d_update_ref  # noqa: E402
from freetoken.kernels.expert_ffn import expert_ffn, expert_ffn_ref  # noqa: E402
from freetoken.kernels.expert_ffn_quant import expert_ffn_quant, expert_ffn_quant_ref  # noqa: E402
from freetoken.kernels.gated_delta_chunk import gated_delta_chunk, gated_delta_chunk_ref  # noqa: E402
from freetoken.kernels.gated_delta_step import gated_delta_step, gated_delta_step_ref  # noqa: E402
from freetoken.kernels.host import attention_host, expert_ffn_host, expert_ffn_quant_host  # noqa: E402
from freetoken.kernels.linear import linear, linear_ref  # noqa: E402
from freetoken.kernels.norm_linear import add_norm_linear, add_norm_linear_ref  # noqa: E402
from freetoken.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_ref  # noqa: E402
from freetoken.kernels.rmsnorm import add_rms_norm, add_rms_norm_ref, rms_norm, rms_norm_ref  # noqa: E402
from freetoken.kernels.rmsnorm_gated import rms_norm_gated, rms_norm_gated_ref  # noqa: E402
from freetoken.kernels.rope import apply_rope, apply_rope_ref  # noqa: E402
from freetoken.kernels.router_linear import router_linear_topk, router_linear_topk_ref  # noqa: E402
from freetoken.kernels.router import router_topk, router_topk_ref, router_weights, router_weights_ref  # noqa: E402

__all__ = [
    "apply_rope", "apply_rope_ref", "qk_norm_rope", "qk_norm_rope_ref", "add_norm_linear", "add_norm_linear_ref",
    "add_rms_norm", "router_linear_topk",
    "router_linear_topk_ref",
    "add_rms_norm_ref", "attention", "attention_compressed", "attention_compressed_ref", "attention_host",
    "attention_ref", "causal_conv1d", "causal_conv1d_ref", "compress_pool", "compress_pool_ref", "hc_head",
    "hc_head_ref", "hc_post", "hc_post_ref", "hc_pre", "hc_pre_ref", "router_weights", "router_weights_ref",
    "causal_conv1d_update", "causal_conv1d_update_ref", "expert_ffn", "expert_ffn_host", "expert_ffn_quant",
    "expert_ffn_quant_host", "expert_ffn_quant_ref", "expert_ffn_ref", "gated_delta_chunk", "gated_delta_chunk_ref", "gated_delta_step",
    "gated_delta_step_ref", "rms_norm_gated", "rms_norm_gated_ref",
    "linear", "linear_ref", "rms_norm", "rms_norm_ref", "router_topk", "router_topk_ref",
]
