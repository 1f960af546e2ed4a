"""Random `PackedWeight`s in every layout the quantized kernels take: random codes (every bit pattern of the format
but NaN), random scales, for kernel-vs-reference checks in tests and on a GPU."""

from __future__ import annotations

import torch

from freetoken.quant.packed import PackedWeight


def random_packed(kind: str, slots: int, shape: tuple[int, int], generator: torch.Generator,
                  device: torch.device | str = "cpu", **layout) -> PackedWeight:
    """kind int4 (layout group, symmetric=False, act_order=False, scale_dtype), fp8 (block) or fp4 (group,
    scale_code, global_op). Scales keep int4 / fp8 / MXFP4 values within a few 1 / sqrt(K); NVFP4's e4m3 scale codes
    span their whole range (zero, subnormals, 448), so its values reach a few units."""
    N, K = shape
    on = {"generator": generator, "device": device}

    def ints(low, high, *size):
        return torch.randint(low, high, size, dtype=torch.int32, **on)

    def positive(*size, scale):
        return (torch.rand(size, **on) + 0.5) * scale

    if kind == "int4":
        group = layout.get("group", K)
        G = K // group
        zeros = torch.full((slots, N, G), 8, dtype=torch.uint8, device=device) if layout.get("symmetric") \
            else ints(0, 17, slots, N, G).to(torch.uint8)  # 16: GPTQ v1's wrapped zero point
        g_idx = None
        if layout.get("act_order"):
            perm = torch.stack([torch.randperm(K, **on) for _ in range(slots)])  # [S, K]
            g_idx = (perm // group).to(torch.int32)  # each group keeps `group` inputs, scattered over K
        scales = positive(slots, N, G, scale=0.5 / K**0.5).to(layout.get("scale_dtype", torch.float16))
        return PackedWeight("int4", (N, K), ints(0, 256, slots, N, K // 2).to(torch.uint8), scales,
                            zeros=zeros, g_idx=g_idx, group=group)
    if kind == "fp8":
        b0, b1 = layout.get("block", (128, 128))
        codes = ints(0, 256, slots, N, K)
        codes = torch.where((codes & 0x7F) == 0x7F, codes - 1, codes).to(torch.uint8)  # no NaN codes
        scales = positive(slots, -(-N // b0), -(-K // b1), scale=1.0 / (64 * K**0.5))  # e4m3 magnitudes reach 448
        return PackedWeight("fp8", (N, K), codes, scales, block=(b0, b1))
    if kind == "fp4":
        group = layout.get("group", 32)
        code = layout.get("scale_code", "e8m0")
        op = layout.get("global_op")
        if code == "e8m0":
            scale_bits = ints(118, 126, slots, N, K // group)  # 2**-9 .. 2**-2
        else:
            scale_bits = ints(0, 0x7F, slots, N, K // group)  # every positive e4m3 code: zero, subnormals, 448
        global_scale = None
        if op is not None:
            magnitude = 2.0**9 if op == "divide" else 2.0**-9  # as the exporters' 448 * 6 / amax and its inverse
            global_scale = positive(slots, scale=magnitude)
        return PackedWeight("fp4", (N, K), ints(0, 256, slots, N, K // 2).to(torch.uint8),
                            scale_bits.to(torch.uint8), global_scale=global_scale, group=group, scale_code=code,
                            global_op=op)
    raise ValueError(f"kind {kind!r}; valid kinds are ['int4', 'fp8', 'fp4']")
