"""The PackedWeight a format repacks into, without any weights: shapes, dtypes and layout fields only.

What the slot pool of a planned size allocates and what `ft bench quant` measures; `cost.expert_bytes` is the
closed form of its `nbytes_per_slot`.
"""

from __future__ import annotations

import torch

from freetoken.quant.config import QuantFormat
from freetoken.quant.cost import INT4_SCALE_BYTES, has_g_idx
from freetoken.quant.packed import PackedWeight

_SCALE_DTYPE = {2: torch.float16, 4: torch.float32}


def packed_template(fmt: QuantFormat, out_dim: int, in_dim: int, num_slots: int = 1,
                    device: torch.device | str = "meta") -> PackedWeight:
    """Zeroed (on "meta": unallocated) PackedWeight [num_slots] of one [out, in] matrix in `fmt`."""
    fmt.check_dims(out_dim, in_dim, f"[{out_dim}, {in_dim}] matrix")
    S, N, K = num_slots, out_dim, in_dim

    def z(*shape, dtype=torch.uint8):
        return torch.zeros((S, *shape), dtype=dtype, device=device)

    if fmt.kind in ("gptq", "awq"):
        group = K if fmt.group_size == -1 else fmt.group_size
        G = K // group
        g_idx = z(K, dtype=torch.int32) if has_g_idx(fmt, K) else None
        return PackedWeight("int4", (N, K), z(N, K // 2), z(N, G, dtype=_SCALE_DTYPE[INT4_SCALE_BYTES]),
                            zeros=z(N, G), g_idx=g_idx, group=group)
    if fmt.kind in ("fp8_block", "fp8_channel"):
        b0, b1 = fmt.block if fmt.kind == "fp8_block" else (1, K)
        return PackedWeight("fp8", (N, K), z(N, K), z(-(-N // b0), -(-K // b1), dtype=torch.float32),
                            block=(b0, b1))
    if fmt.kind == "mxfp4":
        return PackedWeight("fp4", (N, K), z(N, K // 2), z(N, K // 32), group=32, scale_code="e8m0")
    if fmt.kind == "nvfp4":
        return PackedWeight("fp4", (N, K), z(N, K // 2), z(N, K // 16), global_scale=z(dtype=torch.float32),
                            group=16, scale_code="e4m3", global_op=fmt.global_scale)
    raise AssertionError(fmt.kind)
