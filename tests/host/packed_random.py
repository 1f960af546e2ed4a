"""Random PackedWeights of every host format (values and scales drawn directly in the packed layout: the host kernels
read the layout, so what matters is that every bit pattern of it is exercised; the reference is to_float)."""

from __future__ import annotations

import torch

from freetoken.quant.packed import PackedWeight


def int4(E: int, N: int, K: int, group: int, scale_dtype=torch.float16, g_idx: bool = False,
         gen: torch.Generator | None = None) -> PackedWeight:
    G = K // group
    data = torch.randint(0, 256, (E, N, K // 2), dtype=torch.uint8, generator=gen)
    scales = (torch.rand(E, N, G, generator=gen) * 0.02 + 0.001).to(scale_dtype)
    zeros = torch.randint(0, 16, (E, N, G), dtype=torch.uint8, generator=gen)
    gi = torch.stack([torch.randperm(K, generator=gen) // group for _ in range(E)]).int() if g_idx else None
    return PackedWeight("int4", (N, K), data, scales, zeros=zeros, g_idx=gi, group=group)


def fp4(E: int, N: int, K: int, code: str, gen: torch.Generator | None = None) -> PackedWeight:
    data = torch.randint(0, 256, (E, N, K // 2), dtype=torch.uint8, generator=gen)
    if code == "e8m0":  # MXFP4: power-of-two scales per 32
        scales = torch.randint(118, 126, (E, N, K // 32), dtype=torch.uint8, generator=gen)
        return PackedWeight("fp4", (N, K), data, scales, group=32, scale_code="e8m0")
    scales = torch.randint(0x20, 0x40, (E, N, K // 16), dtype=torch.uint8, generator=gen)  # NVFP4: e4m3 per 16
    gs = torch.rand(E, generator=gen) * 2 + 0.5
    return PackedWeight("fp4", (N, K), data, scales, group=16, scale_code="e4m3", global_scale=gs,
                        global_op="divide")


def fp8(E: int, N: int, K: int, block: tuple[int, int], gen: torch.Generator | None = None) -> PackedWeight:
    data = torch.randint(0, 256, (E, N, K), dtype=torch.uint8, generator=gen)
    data[(data & 0x7F) == 0x7F] = 0x11  # no NaN codes
    b0, b1 = block
    scales = torch.rand(E, -(-N // b0), -(-K // b1), generator=gen) * 0.01
    return PackedWeight("fp8", (N, K), data, scales, block=block)


def make(fmt: str, E: int, N: int, K: int, gen: torch.Generator | None = None) -> PackedWeight:
    """fmt: int4-g128 | int4-g32 | int4-g64-bf16 | int4-gidx | mxfp4 | nvfp4 | fp8-block | fp8-channel"""
    if fmt == "int4-g128":
        return int4(E, N, K, 128, gen=gen)
    if fmt == "int4-g32":
        return int4(E, N, K, 32, torch.bfloat16, gen=gen)
    if fmt == "int4-g64-fp32":
        return int4(E, N, K, 64, torch.float32, gen=gen)
    if fmt == "int4-gidx":
        return int4(E, N, K, 64, g_idx=True, gen=gen)
    if fmt in ("mxfp4", "nvfp4"):
        return fp4(E, N, K, "e8m0" if fmt == "mxfp4" else "e4m3", gen=gen)
    return fp8(E, N, K, (128, 128) if fmt == "fp8-block" else (1, K), gen=gen)


FORMATS = ("int4-g128", "int4-g32", "int4-g64-fp32", "int4-gidx", "mxfp4", "nvfp4", "fp8-block", "fp8-channel")


def dequantized(w: PackedWeight) -> torch.Tensor:
    return torch.stack([w.to_float(e) for e in range(w.num_slots)])  # [E, N, K] fp32
