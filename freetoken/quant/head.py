"""The LM head quantized to int8 at load (opt-in): on a CPU a decode token reads the whole head, a bf16 [V, D] matrix
that often outweighs the token's experts in a 4-bit checkpoint (quantized checkpoints keep the head in bf16; llama.cpp
requantizes it, to Q6_K by default). int8 halves those bytes; the host kernels read it packed.

Symmetric per row and group of GROUP inputs: s = max|w| / 127, q = round(w / s) + 128 in 1..255, zero 128, so
w ~ (q - 128) * s within s / 2 (packed.py's int8 rule; the host kernels' int4 x int8 route takes it as is).
Importing it loads no torch (the CLI reads HEAD_HELP and check_lm_head).
"""

from __future__ import annotations

from freetoken.choices import check_one_of

HEAD_FORMATS = ("checkpoint", "int8")
HEAD_HELP = ("the LM head as the checkpoint stores it (default), or int8: quantized once at load (per row and 128 "
             "inputs, symmetric) and read packed by the CPU engine's kernels, halving a bf16 head's bytes per token")


def check_lm_head(value: str, field: str = "--lm-head") -> str:
    return check_one_of(value, HEAD_FORMATS, field)


GROUP = 128  # inputs per scale: the host kernels' int8 path reads groups that are a multiple of 128
ZERO = 128


def int8_head(w, group: int = GROUP, rows_per_pass: int = 512):
    """w [N, K] (a float tensor) -> a one-slot int8 PackedWeight; quantized a block of rows at a time (no fp32 copy
    of the whole head)."""
    import torch

    from freetoken.quant.packed import PackedWeight

    N, K = w.shape
    if K % group:
        raise ValueError(f"lm_head: the head's input dim {K} is not a multiple of {group}; int8 needs whole groups")
    data = torch.empty(1, N, K, dtype=torch.uint8)
    scales = torch.empty(1, N, K // group, dtype=torch.float32)
    for r0 in range(0, N, rows_per_pass):
        block = w[r0:r0 + rows_per_pass].float().view(-1, K // group, group)  # [n, G, group]
        s = block.abs().amax(dim=-1) / 127  # [n, G]
        q = torch.round(block / torch.where(s > 0, s, 1.0)[..., None]).clamp_(-127, 127) + ZERO
        data[0, r0:r0 + rows_per_pass] = q.view(-1, K).to(torch.uint8)
        scales[0, r0:r0 + rows_per_pass] = s
    zeros = torch.full((1, N, K // group), ZERO, dtype=torch.uint8)
    return PackedWeight("int8", (N, K), data, scales, zeros, group=group)


def head_weights(w, head: str, host_kernels: bool):
    """The LM head the engine computes with: the checkpoint's (head 'checkpoint'), or int8_head of it. ValueErrors
    name the field: int8 is read packed by the host kernels only (elsewhere it would be dequantized back), and a head
    the checkpoint quantized already stays as it is."""
    from freetoken.quant.packed import PackedWeight

    if check_lm_head(head, "lm_head") == "checkpoint":
        return w
    if not host_kernels:
        raise ValueError("lm_head: int8 is read by the host kernels (the CPU engine) only; this run computes the head "
                         "elsewhere, where it would be dequantized back: use lm_head 'checkpoint'")
    if isinstance(w, PackedWeight) and w.kind == "int8":  # quantized at load (int8_checkpoint_head)
        return w
    if isinstance(w, PackedWeight):
        raise ValueError(f"lm_head: the checkpoint's LM head is quantized already ({w.kind}); int8 applies to a "
                         f"float head only")
    return int8_head(w)


def int8_checkpoint_head(dense: dict, cfg) -> None:
    """At load (lm_head 'int8'), the dense tensors just read: an untied float head replaced by its int8 form, so that
    its float copy is freed rather than kept beside it. A tied head is the embedding, kept (the engine quantizes a
    copy); a packed one is left for head_weights to refuse."""
    from freetoken.quant.packed import PackedWeight

    w = dense.get("lm_head.weight")
    if w is not None and not cfg.tie_word_embeddings and not isinstance(w, PackedWeight):
        dense["lm_head.weight"] = int8_head(w)
