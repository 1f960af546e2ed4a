"""Small quantizers written for the tests: fp32 [S, N, K] -> (PackedWeight, the dequantized matrices [S, N, K]).

The dequantized matrices come from each quantizer's own variables (q, zero, scale per group or block), not from
freetoken.quant's decoders: torch's float8_e4m3fn cast stands in for the e4m3 bits, a value table for e2m1.
"""

from __future__ import annotations

import torch

from freetoken.quant.packed import PackedWeight

E2M1_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """[..., K] ints 0..15 -> [..., K/2] uint8, even k in the low nibble."""
    return (q[..., 0::2] | (q[..., 1::2] << 4)).to(torch.uint8)


def int4(w: torch.Tensor, group: int, symmetric: bool, act_order: bool, gen: torch.Generator):
    """GPTQ-style round-to-nearest: symmetric zero 8, scale 2 * absmax / 15; asymmetric over [min(w, 0), max(w, 0)]."""
    S, N, K = w.shape
    G = K // group
    q = torch.empty(S, N, K, dtype=torch.int64)
    deq = torch.empty(S, N, K)
    scales = torch.empty(S, N, G, dtype=torch.float16)
    zeros = torch.empty(S, N, G, dtype=torch.uint8)
    g_idx = torch.empty(S, K, dtype=torch.int32)
    for s in range(S):
        g_of_k = torch.randperm(K, generator=gen) // group if act_order else torch.arange(K) // group
        g_idx[s] = g_of_k
        for g in range(G):
            cols = (g_of_k == g).nonzero().squeeze(1)
            wg = w[s][:, cols]  # [N, group]
            if symmetric:
                scale = (2 * wg.abs().amax(1) / 15).half()
                zero = torch.full((N,), 8)
            else:
                lo, hi = wg.amin(1).clamp(max=0), wg.amax(1).clamp(min=0)
                scale = ((hi - lo) / 15).half()
                zero = torch.round(-lo / scale.float()).long().clamp(0, 15)
            qg = (torch.round(wg / scale.float()[:, None]) + zero[:, None]).long().clamp(0, 15)
            q[s][:, cols] = qg
            deq[s][:, cols] = (qg - zero[:, None]).float() * scale.float()[:, None]
            scales[s, :, g], zeros[s, :, g] = scale, zero.to(torch.uint8)
    packed = PackedWeight("int4", (N, K), _nibbles(q), scales, zeros=zeros, g_idx=g_idx if act_order else None,
                          group=group)
    return packed, deq


def fp8(w: torch.Tensor, block: tuple[int, int]):
    """Per block of (b0, b1): scale = amax / 448, data = e4m3(w / scale) (edge blocks partial)."""
    S, N, K = w.shape
    b0, b1 = block
    data = torch.empty(S, N, K, dtype=torch.uint8)
    deq = torch.empty(S, N, K)
    scales = torch.empty(S, -(-N // b0), -(-K // b1))
    for s in range(S):
        for i in range(scales.shape[1]):
            for j in range(scales.shape[2]):
                rows, cols = slice(i * b0, (i + 1) * b0), slice(j * b1, (j + 1) * b1)
                blk = w[s, rows, cols]
                scale = blk.abs().amax() / 448
                q8 = (blk / scale).to(torch.float8_e4m3fn)
                data[s, rows, cols] = q8.view(torch.uint8)
                deq[s, rows, cols] = q8.float() * scale
                scales[s, i, j] = scale
    return PackedWeight("fp8", (N, K), data, scales, block=block), deq


def _e2m1(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest e2m1 value of each element -> (codes 0..15, values)."""
    idx = (v.abs()[..., None] - E2M1_MAGNITUDES).abs().argmin(-1)
    sign = v < 0
    return idx | (sign.long() << 3), torch.where(sign, -E2M1_MAGNITUDES[idx], E2M1_MAGNITUDES[idx])


def fp4(w: torch.Tensor, group: int, scale_code: str, global_op: str | None = None):
    """MXFP4 (e8m0 scale 2**ceil(log2(amax / 6))) or NVFP4 (e4m3 scale amax / 6 folded with a per-slot global scale:
    divide = compressed-tensors' 448 * 6 / amax, multiply = ModelOpt's amax / (448 * 6))."""
    S, N, K = w.shape
    wg = w.reshape(S, N, K // group, group)
    amax = wg.abs().amax(-1)  # [S, N, G]
    global_scale = None
    if scale_code == "e8m0":
        exp = torch.ceil(torch.log2(amax / 6)).long()
        scale_bits = (exp + 127).to(torch.uint8)
        block_scale = torch.pow(2.0, exp.float())  # [S, N, G]
    else:
        tensor_amax = w.abs().reshape(S, -1).amax(1)  # [S]
        if global_op == "divide":
            global_scale = 448 * 6 / tensor_amax
            s8 = (amax / 6 * global_scale[:, None, None]).to(torch.float8_e4m3fn)
            block_scale = s8.float() / global_scale[:, None, None]
        else:
            global_scale = tensor_amax / (448 * 6)
            s8 = (amax / 6 / global_scale[:, None, None]).to(torch.float8_e4m3fn)
            block_scale = s8.float() * global_scale[:, None, None]
        scale_bits = s8.view(torch.uint8)
    codes, values = _e2m1(wg / block_scale[..., None])
    deq = (values * block_scale[..., None]).reshape(S, N, K)
    packed = PackedWeight("fp4", (N, K), _nibbles(codes.reshape(S, N, K)), scale_bits, global_scale=global_scale,
                          group=group, scale_code=scale_code, global_op=global_op)
    return packed, deq
