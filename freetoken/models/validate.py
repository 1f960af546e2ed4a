"""One validation pass over a checkpoint's config.json before anything else reads it, and the checks every weight
tensor gets as it is read: each failure one line naming the file and the field or tensor.

config.json: every value of a known field is checked for its type (integer, number, true / false, token id) and
sign; every number anywhere in the file (nested rope_parameters, text_config, ...) must be finite. The families'
readers then check what ties fields together (heads vs key/value heads, experts vs top-k, layer types vs layers).
Weights: a dense tensor must hold float32 / bfloat16 / float16 values (integer tables where the family says so,
FP8 only under a quantization_config), and a bounded sample of its values must be finite.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from freetoken.models.config import CheckpointError

POSITIVE_INT = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "moe_intermediate_size", "num_experts", "num_local_experts", "n_routed_experts",
    "num_experts_per_tok", "max_position_embeddings", "decoder_sparse_step", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_group", "topk_group", "moe_layer_freq",
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
    "linear_conv_kernel_dim", "full_attention_interval", "index_topk", "index_n_heads", "index_head_dim", "o_groups",
    "o_lora_rank", "hc_mult", "hc_sinkhorn_iters", "rotary_dim", "original_max_position_embeddings",
    "compress_rate_csa", "compress_rate_hca")
NONNEGATIVE_INT = ("sliding_window", "q_lora_rank", "first_k_dense_replace", "n_shared_experts",
                   "num_nextn_predict_layers", "num_hash_layers", "shared_expert_intermediate_size")
POSITIVE_FLOAT = ("rms_norm_eps", "rope_theta", "compress_rope_theta", "routed_scaling_factor", "hc_eps",
                  "swiglu_limit", "swiglu_alpha", "clip_qkv", "factor", "beta_fast", "beta_slow", "attention_factor")
FRACTION = ("partial_rotary_factor",)  # in (0, 1]
BOOL = ("tie_word_embeddings", "norm_topk_prob", "attention_bias", "use_qk_norm", "qkv_bias", "use_sliding_window",
        "rope_interleave", "mlp_bias", "truncate")
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SAMPLE = 1 << 16  # values of a tensor checked for NaN / Inf: all of a small one, a strided sample of a larger one


def validate_config(raw: dict, path: str) -> None:
    """config.json's fields (raw, as parsed) -> nothing, or one CheckpointError naming the file and the field."""
    _walk(raw, path, "", raw.get("vocab_size") if isinstance(raw.get("vocab_size"), int) else None)


def _walk(node: dict, path: str, prefix: str, vocab: int | None) -> None:
    for key, value in node.items():
        field = f"{prefix}{key}"
        if isinstance(value, dict):
            sub_vocab = value.get("vocab_size") if isinstance(value.get("vocab_size"), int) else vocab
            _walk(value, path, f"{field}.", sub_vocab)
            continue
        if value is None:
            continue
        _finite(value, path, field)
        if key in POSITIVE_INT or key in NONNEGATIVE_INT:
            low = 1 if key in POSITIVE_INT else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                want = "a positive integer" if low else "an integer >= 0"
                raise CheckpointError(f"{path}: field {field!r} must be {want}, got {value!r}")
        elif key in POSITIVE_FLOAT or key in FRACTION:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or \
                    (key in FRACTION and value > 1):
                want = "a number in (0, 1]" if key in FRACTION else "a positive number"
                raise CheckpointError(f"{path}: field {field!r} must be {want}, got {value!r}")
        elif key in BOOL and not isinstance(value, bool):
            raise CheckpointError(f"{path}: field {field!r} must be true or false, got {value!r}")
        elif key in TOKEN_IDS:
            ids = value if isinstance(value, list) else [value]
            if not ids or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 or (vocab and i >= vocab)
                              for i in ids):
                span = f"[0, {vocab})" if vocab else ">= 0"
                raise CheckpointError(f"{path}: field {field!r} must be a token id {span} or a list of them, got "
                                      f"{value!r}")


def _finite(value: Any, path: str, field: str) -> None:
    items = value if isinstance(value, list) else [value]
    for v in items:
        if isinstance(v, float) and not math.isfinite(v):
            raise CheckpointError(f"{path}: field {field!r} must be finite, got {value!r}")


def check_dtype(file: Any, name: str, dtype: torch.dtype, integer: bool = False) -> None:
    """A dense tensor's stored dtype, from the file's header (before its bytes are read): float32 / bfloat16 /
    float16 for a weight, an integer type for an integer table."""
    if integer:
        if dtype.is_floating_point or dtype.is_complex:
            raise CheckpointError(f"{file}: tensor {name!r} is {_dtype(dtype)}, expected an integer table")
        return
    if dtype not in WEIGHT_DTYPES:
        fp8 = ", or a quantization_config for FP8" if dtype.is_floating_point and dtype.itemsize == 1 else ""
        raise CheckpointError(f"{file}: tensor {name!r} is {_dtype(dtype)}, not a weight dtype (float32, bfloat16, "
                              f"float16{fp8})")


# a weight dtype's bits: (torch's same-size integer view, numpy's unsigned one, exponent shift, exponent mask,
# mantissa mask)
_BITS = {torch.float32: (torch.int32, np.uint32, 23, 0xFF, (1 << 23) - 1),
         torch.bfloat16: (torch.int16, np.uint16, 7, 0xFF, 0x7F),
         torch.float16: (torch.int16, np.uint16, 10, 0x1F, 0x3FF)}


def check_values(file: Any, name: str, t: torch.Tensor) -> None:
    """A weight's values as read: finite on a bounded sample (all of a small tensor, a strided sample of a large).
    Read from the bits with numpy (an all-ones exponent: Inf, NaN with a mantissa), so a check runs no torch
    parallel region: the checkpoint loader checks from several threads at once."""
    flat = t.reshape(-1)
    sample = flat if flat.numel() <= SAMPLE else flat[::-(-flat.numel() // SAMPLE)]
    spec = _BITS.get(sample.dtype)
    if spec is None:  # (another float dtype: torch's test)
        special, nan = ~torch.isfinite(sample), torch.isnan(sample)
        count, is_nan = int(special.sum()), bool(nan.any())
    else:
        signed, unsigned, shift, exp_mask, man_mask = spec
        bits = sample.contiguous().view(signed).numpy().view(unsigned)  # [N]
        special = ((bits >> shift) & exp_mask) == exp_mask
        count = int(np.count_nonzero(special))
        is_nan = count > 0 and bool((bits[special] & man_mask).any())
    if count:
        raise CheckpointError(f"{file}: tensor {name!r} holds {'NaN' if is_nan else 'Inf'} values ({count} of the "
                              f"{sample.numel()} checked)")


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
