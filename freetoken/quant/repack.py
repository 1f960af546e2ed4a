"""Checkpoint tensors -> `PackedWeight`: every exporter's layout repacked once, at load, into the one layout of the
host store and the slot pool (packed.py). Values are not requantized, and there is no second decoder:
freetoken.quant.dequantize is `repack(...).to_float(...)`, so what the tests check against each exporter's own
writer is exactly what the kernels compute from.

Int4 (GPTQ / AutoRound, AWQ) stores w[n, k] = scale[g, n] * (q[k, n] - zero[g, n]) with 8 nibbles per int32, low
nibble first; GPTQ packs the input axis, AWQ the output axis in an interleaved nibble order.

    w = repack(fmt, tensors, "model.layers.0.mlp.experts.3.down_proj")     # S = 1
    w = repack(fmt, tensors, "model.layers.0.mlp.experts.down_proj")       # mxfp4: S = E, every expert
    layer = stack([repack(fmt, tensors, p) for p in prefixes])              # S = E
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch

from freetoken import hugepages
from freetoken.quant.config import QuantFormat
from freetoken.quant.bits import decode_e8m0
from freetoken.quant.errors import QuantError, as_bytes, check_shape, require
from freetoken.quant.packed import PackedWeight, layout_fields

Tensors = Mapping[str, torch.Tensor]
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ int32 holds column 8*c + AWQ_ORDER[i]
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)  # [8]


def unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """[R, C] int32 -> [8R, C]: nibble i of packed[r] is row 8r + i (GPTQ qweight)."""
    nib = (packed.unsqueeze(1) >> _SHIFTS.to(packed.device).view(1, 8, 1)) & 0xF  # [R, 8, C]
    return nib.reshape(-1, packed.shape[1])


def unpack_cols(packed: torch.Tensor, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """[R, C] int32 -> [R, 8C]: nibble i of packed[:, c] is column 8c + order[i] (GPTQ qzeros, AWQ)."""
    nib = (packed.unsqueeze(2) >> _SHIFTS.to(packed.device).view(1, 1, 8)) & 0xF  # [R, C, 8] in nibble order
    inverse = [order.index(j) for j in range(8)]  # column j sits in nibble inverse[j]
    return nib[:, :, inverse].reshape(packed.shape[0], -1)


def gptq_nibbles(qweight: torch.Tensor) -> torch.Tensor:
    """GPTQ's qweight [K/8, N] int32 -> packed.py's [N, K/2] uint8. Byte j of qweight[r, n] (little-endian) holds
    inputs 8r + 2j (low nibble) and 8r + 2j + 1 (high) of output n: byte 4r + j of the packed row, so the repack is one
    transpose of 32-bit words (the nibble-by-nibble route, kept for big-endian hosts, took ~60x longer)."""
    if sys.byteorder != "little":
        return pack_nibbles(unpack_rows(qweight).t())
    return qweight.t().contiguous().view(torch.uint8).reshape(qweight.shape[1], -1)


def gptq_zeros(qzeros: torch.Tensor) -> torch.Tensor:
    """GPTQ's qzeros [G, N/8] int32 -> [G, N] uint8 zero codes (nibble i of qzeros[g, c] is column 8c + i), read
    byte-wise as gptq_nibbles reads qweight."""
    if sys.byteorder != "little":
        return unpack_cols(qzeros).to(torch.uint8)
    b = qzeros.contiguous().view(torch.uint8)  # [G, N/2]
    return torch.stack((b & 0xF, b >> 4), dim=-1).reshape(qzeros.shape[0], -1)


def fp8_scale(tensors: Tensors, name: str) -> torch.Tensor:
    """An FP8 weight's dequant scale as fp32 (DeepSeek's `weight_scale_inv` is already the dequant scale); ue8m0
    `scale_fmt` checkpoints store power-of-two exponents, decoded exactly."""
    s = require(tensors, name)
    if s.element_size() == 1:
        return decode_e8m0(as_bytes(name, s))
    return s.to(torch.float32)


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """[..., K] ints 0..15 -> [..., K/2] uint8, element k in byte k // 2, low nibble for even k."""
    q = q.to(torch.uint8)
    return q[..., 0::2] | (q[..., 1::2] << 4)


def _groups(fmt: QuantFormat, in_dim: int, what: str) -> int:
    fmt.check_dims(0, in_dim, what)
    return 1 if fmt.group_size == -1 else in_dim // fmt.group_size


def _int4(data: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None,
          groups: int) -> PackedWeight:
    """data [N, K/2] uint8 (packed.py's nibbles), zeros [G, N] (the zero point itself), scales [G, N], g_idx [K] or
    None -> int4, S = 1."""
    N, K = data.shape[0], 2 * data.shape[1]
    if g_idx is not None and torch.equal(g_idx.to(torch.int64), torch.arange(K, device=g_idx.device) * groups // K):
        g_idx = None  # the plain k // group mapping many exporters store anyway: no need to carry it
    return PackedWeight(
        "int4", (N, K), data[None].contiguous(),  # [1, N, K/2]
        scales.t()[None].contiguous(),  # [1, N, G]
        zeros=zeros.t().to(torch.uint8)[None].contiguous(),  # [1, N, G]
        g_idx=None if g_idx is None else g_idx.to(torch.int32)[None].contiguous(),  # [1, K]
        group=K // groups)


def repack_gptq(tensors: Tensors, prefix: str, fmt: QuantFormat) -> PackedWeight:
    """`.qweight` [K/8, N] int32, `.qzeros` [G, N/8], `.scales` [G, N], optional `.g_idx` [K]; v1 zeros + 1."""
    qw_name, qz_name, sc_name, gi_name = (f"{prefix}.{fmt.name(r)}" for r in ("qweight", "qzeros", "scales", "g_idx"))
    qweight = require(tensors, qw_name, (torch.int32,))
    in_dim, out_dim = qweight.shape[0] * 8, qweight.shape[1]
    if out_dim % 8:
        raise QuantError(f"tensor {qw_name!r}: out dim {out_dim} is not a multiple of 8 (qzeros packing)")
    groups = _groups(fmt, in_dim, qw_name)
    qzeros = require(tensors, qz_name, (torch.int32,))
    scales = require(tensors, sc_name, SCALE_DTYPES)
    check_shape(qz_name, qzeros, (groups, out_dim // 8))
    check_shape(sc_name, scales, (groups, out_dim))
    g_idx = None
    if gi_name in tensors:
        g_idx = tensors[gi_name].to(torch.int64)
        check_shape(gi_name, g_idx, (in_dim,))
        if g_idx.numel() and (g_idx.min() < 0 or g_idx.max() >= groups):
            raise QuantError(f"tensor {gi_name!r}: group ids outside [0, {groups})")
    elif fmt.desc_act:
        raise QuantError(f"missing tensor {gi_name!r} (desc_act=true needs the act-order group index)")
    zeros = gptq_zeros(qzeros) + fmt.zero_offset  # [G, N]; v1's wrapped -1 reads back as 16, as in AutoGPTQ
    return _int4(gptq_nibbles(qweight), zeros, scales, g_idx, groups)


def repack_awq(tensors: Tensors, prefix: str, fmt: QuantFormat) -> PackedWeight:
    """`.qweight` [K, N/8] int32, `.qzeros` [G, N/8], `.scales` [G, N], AWQ's interleaved nibble order."""
    qw_name, qz_name, sc_name = (f"{prefix}.{fmt.name(r)}" for r in ("qweight", "qzeros", "scales"))
    qweight = require(tensors, qw_name, (torch.int32,))
    in_dim, out_dim = qweight.shape[0], qweight.shape[1] * 8
    groups = _groups(fmt, in_dim, qw_name)
    qzeros = require(tensors, qz_name, (torch.int32,))
    scales = require(tensors, sc_name, SCALE_DTYPES)
    check_shape(qz_name, qzeros, (groups, out_dim // 8))
    check_shape(sc_name, scales, (groups, out_dim))
    return _int4(pack_nibbles(unpack_cols(qweight, AWQ_ORDER).t()), unpack_cols(qzeros, AWQ_ORDER), scales, None,
                 groups)


def _fp8_weight(tensors: Tensors, prefix: str, fmt: QuantFormat) -> tuple[torch.Tensor, str]:
    name = f"{prefix}.{fmt.name('weight')}"
    w = as_bytes(name, require(tensors, name))
    if w.dim() != 2:
        raise QuantError(f"tensor {name!r}: shape {tuple(w.shape)}, expected [out, in]")
    return w, f"{prefix}.{fmt.name('scale')}"


def repack_fp8_block(tensors: Tensors, prefix: str, fmt: QuantFormat) -> PackedWeight:
    """`.weight` e4m3 [N, K], `.weight_scale_inv` (fp32 or e8m0 -> fp32) [ceil(N/b0), ceil(K/b1)]."""
    w, s_name = _fp8_weight(tensors, prefix, fmt)
    scale = fp8_scale(tensors, s_name)
    (b0, b1), (out_dim, in_dim) = fmt.block, w.shape
    check_shape(s_name, scale, (-(-out_dim // b0), -(-in_dim // b1)))
    return PackedWeight("fp8", (out_dim, in_dim), w[None].contiguous(), scale[None].contiguous(), block=(b0, b1))


def repack_fp8_channel(tensors: Tensors, prefix: str, fmt: QuantFormat) -> PackedWeight:
    """`.weight` e4m3 [N, K], `.weight_scale` [N, 1] or [N] -> fp8 with block (1, K)."""
    w, s_name = _fp8_weight(tensors, prefix, fmt)
    scale = fp8_scale(tensors, s_name)
    if scale.dim() == 1:
        scale = scale[:, None]
    check_shape(s_name, scale, (w.shape[0], 1))
    return PackedWeight("fp8", tuple(w.shape), w[None].contiguous(), scale[None].contiguous(),
                        block=(1, w.shape[1]))


def repack_mxfp4(tensors: Tensors, prefix: str, fmt: QuantFormat) -> PackedWeight:
    """gpt-oss `{prefix}_blocks` [E, N, K/32, 16], `{prefix}_scales` [E, N, K/32] -> fp4 e8m0, S = E; DeepSeek-V4's
    experts (method fp8): `.weight` [N, K/2] (int8, low nibble first) and its e8m0 scale [N, K/32], S = 1."""
    if fmt.method == "fp8":
        return _repack_fp4_rows(tensors, prefix, fmt)
    b_name, s_name = prefix + fmt.name("blocks"), prefix + fmt.name("scales")
    blocks = as_bytes(b_name, require(tensors, b_name))
    scales = as_bytes(s_name, require(tensors, s_name))
    if blocks.dim() != 4 or blocks.shape[-1] != fmt.group_size // 2:
        raise QuantError(f"tensor {b_name!r}: shape {tuple(blocks.shape)}, expected [E, out, in/32, 16]")
    check_shape(s_name, scales, tuple(blocks.shape[:3]))
    E, N, G, _ = blocks.shape
    return PackedWeight("fp4", (N, G * fmt.group_size), blocks.reshape(E, N, -1).contiguous(), scales.contiguous(),
                        group=fmt.group_size, scale_code="e8m0")


def _nibble_rows(tensors: Tensors, name: str, fmt: QuantFormat) -> tuple[torch.Tensor, int, int]:
    """A tensor of two 4-bit values per byte, [out, in/2] -> (its bytes, out, in), the dims checked against fmt."""
    packed = as_bytes(name, require(tensors, name))
    if packed.dim() != 2:
        raise QuantError(f"tensor {name!r}: shape {tuple(packed.shape)}, expected [out, in/2]")
    out_dim, in_dim = packed.shape[0], packed.shape[1] * 2
    fmt.check_dims(out_dim, in_dim, name)
    return packed, out_dim, in_dim


def _repack_fp4_rows(tensors: Tensors, prefix: str, fmt: QuantFormat) -> PackedWeight:
    w_name, s_name = f"{prefix}.{fmt.name('weight')}", f"{prefix}.{fmt.name('scale')}"
    packed, out_dim, in_dim = _nibble_rows(tensors, w_name, fmt)
    scale = as_bytes(s_name, require(tensors, s_name))
    check_shape(s_name, scale, (out_dim, in_dim // fmt.group_size))
    return PackedWeight("fp4", (out_dim, in_dim), packed[None].contiguous(), scale[None].contiguous(),
                        group=fmt.group_size, scale_code="e8m0")


def repack_nvfp4(tensors: Tensors, prefix: str, fmt: QuantFormat) -> PackedWeight:
    """`.<packed>` [N, K/2] uint8, `.weight_scale` e4m3 [N, K/16] (kept as bits), `.<global>` one fp32.

    The per-tensor scale has two conventions, told apart by the tensor name (fixed in parse_quant_config):
    compressed-tensors `weight_global_scale` = 448 * 6 / amax was multiplied into the block scales, so divide;
    NVIDIA ModelOpt `weight_scale_2` = amax / (448 * 6): multiply. The wrong direction is off by (448*6/amax)**2."""
    p_name, s_name, g_name = (f"{prefix}.{fmt.name(r)}" for r in ("packed", "scale", "global"))
    packed, out_dim, in_dim = _nibble_rows(tensors, p_name, fmt)
    scale = as_bytes(s_name, require(tensors, s_name))
    check_shape(s_name, scale, (out_dim, in_dim // 16))
    glob = require(tensors, g_name).to(torch.float32)
    if glob.numel() != 1:
        raise QuantError(f"tensor {g_name!r}: {glob.numel()} elements, expected one per-tensor scale")
    return PackedWeight("fp4", (out_dim, in_dim), packed[None].contiguous(), scale[None].contiguous(),
                        global_scale=glob.reshape(1).contiguous(), group=16, scale_code="e4m3",
                        global_op=fmt.global_scale)


REPACKERS = {
    "gptq": repack_gptq,
    "awq": repack_awq,
    "fp8_block": repack_fp8_block,
    "fp8_channel": repack_fp8_channel,
    "mxfp4": repack_mxfp4,
    "nvfp4": repack_nvfp4,
}


def repack(fmt: QuantFormat, tensors: Tensors, prefix: str) -> PackedWeight:
    """One matrix's checkpoint tensors -> PackedWeight with S = 1 (mxfp4: its fused tensors, S = E)."""
    return REPACKERS[fmt.kind](tensors, prefix, fmt)


def _layout(w: PackedWeight) -> tuple:
    shapes = {name: tuple(t.shape[1:]) for name, t in w.tensors().items()}
    dtypes = {name: t.dtype for name, t in w.tensors().items()}
    return tuple(getattr(w, f) for f in layout_fields()), shapes, dtypes


def stack(parts: Sequence[PackedWeight], what: str = "experts", pin: bool = False) -> PackedWeight:
    """Per-expert PackedWeights (S each, usually 1) -> one [sum S, ...] PackedWeight, page-locked if `pin`.

    Where only some parts carry an act-order g_idx, the others get their plain k // group one."""
    if not parts:
        raise QuantError(f"{what}: nothing to stack")
    if any(p.g_idx is not None for p in parts):
        parts = [p if p.g_idx is not None or p.kind != "int4" else
                 replace(p, g_idx=(torch.arange(p.shape[1], dtype=torch.int32) // p.group)
                         .expand(p.num_slots, -1).contiguous()) for p in parts]
    first = _layout(parts[0])
    for i, p in enumerate(parts[1:], 1):
        if _layout(p) != first:
            raise QuantError(f"{what}: part {i} has layout {_layout(p)}, part 0 has {first}")
    slots = sum(p.num_slots for p in parts)  # every slot copied below; on huge pages: the host kernels stream them
    out = replace(parts[0], **{name: hugepages.empty((slots, *t.shape[1:]), t.dtype, pin)
                              for name, t in parts[0].tensors().items()})
    row = 0
    for p in parts:
        for name, t in p.tensors().items():
            getattr(out, name)[row:row + p.num_slots].copy_(t)
        row += p.num_slots
    return out


def take_rows(w: PackedWeight, start: int, step: int) -> PackedWeight:
    """Rows start::step of every matrix (gpt-oss interleaves gate and up rows: gate = 0::2, up = 1::2)."""
    if w.kind == "fp8" and w.block[0] != 1:
        raise QuantError(f"fp8 block rows {w.block[0]}: rows cannot be taken apart from their block scales")
    rows = {name: t[:, start::step].contiguous() for name, t in w.tensors().items()
            if name not in ("g_idx", "global_scale")}
    return replace(w, shape=(len(range(start, w.shape[0], step)), w.shape[1]), **rows)
