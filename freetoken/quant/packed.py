"""`PackedWeight`: the one in-memory layout of quantized expert matrices, in the host store and in GPU slots alike.

Every checkpoint format is repacked once, at load, into one of three kinds so that one kernel per kind reads them
(always as integer or plain-float tensors: the Triton interpreter cannot load fp8 pointers); a fourth, int8, is made
at load from a float LM head. A matrix W is [N out, K in]; every tensor has a leading slot/expert dim S, so copying
expert e into slot s is one row copy per tensor and a fetch moves exactly `nbytes_per_slot` bytes.

- `int4` (GPTQ, AutoRound, AWQ): data uint8 [S, N, K/2], element k of row n in byte k // 2, low nibble for even k;
  scales fp16/bf16/fp32 [S, N, G]; zeros uint8 [S, N, G] (the zero point itself, 0..16); optional g_idx int32
  [S, K] (act-order group of each input). w[n, k] = (q - zeros[n, g]) * scales[n, g], g = g_idx[k] or k // group.
- `int8` (an LM head quantized at load, freetoken/quant/head.py): int4's layout and rule with a byte per weight,
  data uint8 [S, N, K] in column order; no g_idx.
- `fp8` (block and per-channel e4m3): data uint8 [S, N, K] (e4m3 bits); scales fp32 [S, ceil(N/b0), ceil(K/b1)]
  with block (b0, b1) (per channel: (1, K)). w[n, k] = e4m3(data) * scales[n // b0, k // b1].
- `fp4` (MXFP4, NVFP4): data uint8 [S, N, K/2] e2m1 codes, low nibble for even k; scales uint8 [S, N, K/group],
  `scale_code` "e8m0" (MXFP4, group 32) or "e4m3" (NVFP4, group 16); NVFP4 also global_scale fp32 [S], applied
  as `global_op` says ("divide": compressed-tensors, "multiply": ModelOpt).
  w[n, k] = e2m1(data) * decode(scales[n, k // group]) (/ or *) global_scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch

from freetoken.quant.bits import decode_e2m1_packed, decode_e4m3, decode_e8m0
from freetoken.quant.errors import QuantError

PACKED_KINDS = ("int4", "fp8", "fp4", "int8")
SCALE_CODES = ("e8m0", "e4m3")
TENSOR_FIELDS = ("data", "scales", "zeros", "g_idx", "global_scale")


@dataclass(slots=True)
class PackedWeight:
    kind: str
    shape: tuple[int, int]  # (N, K) of one matrix
    data: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None = None
    g_idx: torch.Tensor | None = None
    global_scale: torch.Tensor | None = None
    group: int = 0  # int4 / int8: inputs per scale (K for one group); fp4: 32 or 16
    block: tuple[int, int] | None = None  # fp8
    scale_code: str | None = None  # fp4
    global_op: str | None = None  # fp4 with global_scale: "divide" | "multiply"

    def __post_init__(self) -> None:
        self.validate()

    @property
    def num_slots(self) -> int:
        return self.data.shape[0]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f: getattr(self, f) for f in TENSOR_FIELDS if getattr(self, f) is not None}

    @property
    def nbytes(self) -> int:
        """Bytes of every slot (as torch.Tensor.nbytes is of a tensor)."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    @property
    def nbytes_per_slot(self) -> int:
        """What one slot holds and one fetch moves: packed values and all their scales."""
        return sum(math.prod(t.shape[1:]) * t.element_size() for t in self.tensors().values())

    def expected_shapes(self, S: int) -> dict[str, tuple[int, ...]]:
        N, K = self.shape
        if self.kind in ("int4", "int8"):
            G = K // self.group
            out = {"data": (S, N, K // 2 if self.kind == "int4" else K), "scales": (S, N, G), "zeros": (S, N, G)}
            if self.g_idx is not None:
                out["g_idx"] = (S, K)
            return out
        if self.kind == "fp8":
            b0, b1 = self.block
            return {"data": (S, N, K), "scales": (S, -(-N // b0), -(-K // b1))}
        out = {"data": (S, N, K // 2), "scales": (S, N, K // self.group)}
        if self.global_scale is not None:
            out["global_scale"] = (S,)
        return out

    def validate(self, what: str = "packed weight") -> None:
        """Fail naming the field when shapes, dtypes or layout parameters disagree."""
        if self.kind not in PACKED_KINDS:
            raise QuantError(f"{what}: kind {self.kind!r}; valid kinds are {list(PACKED_KINDS)}")
        N, K = self.shape
        if self.kind in ("int4", "fp4", "int8") and (K % 2 or self.group <= 0 or K % self.group):
            raise QuantError(f"{what}: group {self.group} must divide the input dim {K} (and K must be even)")
        if self.kind in ("int4", "int8") and self.zeros is None:
            raise QuantError(f"{what}: {self.kind} needs zeros")
        if self.kind == "int8" and self.g_idx is not None:
            raise QuantError(f"{what}: int8 takes no g_idx")
        if self.kind == "fp8" and (self.block is None or min(self.block) <= 0):
            raise QuantError(f"{what}: fp8 needs a positive block (rows, cols), got {self.block}")
        if self.kind == "fp4":
            if self.scale_code not in SCALE_CODES:
                raise QuantError(f"{what}: scale_code {self.scale_code!r}; valid are {list(SCALE_CODES)}")
            if (self.global_scale is None) != (self.global_op is None) or \
                    self.global_op not in (None, "divide", "multiply"):
                raise QuantError(f"{what}: global_scale needs global_op 'divide' or 'multiply' (and vice versa)")
        byte_fields = ("data", "zeros") + (("scales",) if self.kind == "fp4" else ())
        for name, t in self.tensors().items():
            if name in byte_fields and t.dtype != torch.uint8:
                raise QuantError(f"{what}.{name}: dtype {t.dtype}, expected torch.uint8")
        if self.g_idx is not None and self.g_idx.dtype != torch.int32:
            raise QuantError(f"{what}.g_idx: dtype {self.g_idx.dtype}, expected torch.int32")
        for name, shape in self.expected_shapes(self.data.shape[0]).items():
            if tuple(getattr(self, name).shape) != shape:
                raise QuantError(f"{what}.{name}: shape {tuple(getattr(self, name).shape)}, expected {shape}")

    def empty_slots(self, num_slots: int, device: torch.device | str = "cpu", pin: bool = False) -> "PackedWeight":
        """The same layout with `num_slots` zeroed slots (a slot pool); a global scale of 1, so that an empty slot
        dequantizes to zeros (not 0 / 0) under either global_op."""
        new = {name: torch.zeros((num_slots, *t.shape[1:]), dtype=t.dtype, device=device, pin_memory=pin)
               for name, t in self.tensors().items()}
        if "global_scale" in new:
            new["global_scale"].fill_(1.0)
        return replace(self, **new)

    def copy_slot(self, slot: int, src: "PackedWeight", index: int, non_blocking: bool = False) -> None:
        """self[slot] <- src[index] for every tensor (host -> device asynchronously from pinned memory)."""
        for name, t in self.tensors().items():
            t[slot].copy_(getattr(src, name)[index], non_blocking=non_blocking)

    def select(self, index: int) -> "PackedWeight":
        """One slot as a PackedWeight with S = 1 (views, no copy)."""
        return replace(self, **{name: t[index:index + 1] for name, t in self.tensors().items()})

    def to(self, device: torch.device | str) -> "PackedWeight":
        return replace(self, **{name: t.to(device) for name, t in self.tensors().items()})

    def to_float(self, index: int) -> torch.Tensor:
        """Slot `index` dequantized to fp32 [N, K]: the reference every kernel and the CPU lane are checked against."""
        return dequantize_packed(self, index)


def cat_rows(ws: list[PackedWeight]) -> PackedWeight | None:
    """Single-slot matrices of one layout stacked along their rows (q, k and v as one projection), or None where
    the layouts cannot share one matrix (kinds, groups or global scales differ, act-order g_idx, fp8 row blocks
    that do not divide every matrix)."""
    first = ws[0]
    same = all(w.kind == first.kind and w.shape[1] == first.shape[1] and w.group == first.group and
               w.block == first.block and w.scale_code == first.scale_code and w.global_op == first.global_op and
               w.num_slots == 1 and w.g_idx is None for w in ws)
    if not same or (first.kind == "fp8" and any(w.shape[0] % first.block[0] for w in ws[:-1])):
        return None
    if first.global_scale is not None and any(not torch.equal(w.global_scale, first.global_scale) for w in ws):
        return None
    tensors = {name: torch.cat([getattr(w, name) for w in ws], dim=1) for name in ("data", "scales", "zeros")
               if getattr(first, name) is not None}
    return replace(first, shape=(sum(w.shape[0] for w in ws), first.shape[1]), **tensors)


def dequantize_packed(w: PackedWeight, index: int) -> torch.Tensor:
    N, K = w.shape
    if w.kind in ("int4", "int8"):  # one rule: (q - zero) * scale per group; int4 packs two codes a byte
        if w.kind == "int4":
            b = w.data[index].to(torch.int32)  # [N, K/2]
            q = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(N, K).to(torch.float32)
        else:
            q = w.data[index].to(torch.float32)  # [N, K]
        if w.g_idx is not None:  # (int4 only)
            g = w.g_idx[index].to(torch.long)  # [K]
        else:
            g = torch.arange(K, device=q.device) // w.group
        zeros = w.zeros[index].to(torch.float32)[:, g]  # [N, K]
        return (q - zeros) * w.scales[index].to(torch.float32)[:, g]
    if w.kind == "fp8":
        b0, b1 = w.block
        s = w.scales[index].to(torch.float32)
        s = s.repeat_interleave(b0, 0)[:N].repeat_interleave(b1, 1)[:, :K]  # [N, K]
        return decode_e4m3(w.data[index]) * s
    codes = decode_e2m1_packed(w.data[index])  # [N, K]
    s = (decode_e8m0 if w.scale_code == "e8m0" else decode_e4m3)(w.scales[index])  # [N, K/group]
    if w.global_scale is not None:
        g = w.global_scale[index].to(torch.float32)
        s = s / g if w.global_op == "divide" else s * g
    return codes * s.repeat_interleave(w.group, 1)


def layout_fields() -> tuple[str, ...]:
    """Non-tensor fields, for code that rebuilds a PackedWeight around new tensors."""
    return tuple(f.name for f in fields(PackedWeight) if f.name not in TENSOR_FIELDS)
