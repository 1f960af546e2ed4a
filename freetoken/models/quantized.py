"""Reading a quantized checkpoint: routed experts stay packed (one PackedWeight per projection, S = E), every other
linear layer stored quantized (GPTQ quantizes attention too) is dequantized to the compute dtype at load.

Which layers are quantized is decided per tensor by the names present: `{p}.qweight` (int4) or `{p}.<scale>`
(FP8, NVFP4) means quantized, a lone `{p}.weight` means left as is (`modules_to_not_convert`, compressed-tensors
`ignore`: the router, lm_head); neither fails naming the tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch

from freetoken.models.config import CheckpointError, ModelConfig
from freetoken.models.family import Family
from freetoken.quant import QuantFormat, dequantize
from freetoken.quant.packed import PackedWeight
from freetoken.quant.repack import repack, stack, take_rows

# the tensor whose presence marks `{p}` as quantized, by format kind (mxfp4 checkpoints quantize only experts)
MARKER_ROLE = {"gptq": "qweight", "awq": "qweight", "fp8_block": "scale", "fp8_channel": "scale", "nvfp4": "scale"}


class TensorView(Mapping):
    """The checkpoint's tensors as the dict freetoken.quant reads: `in` asks the shard map, [] reads the tensor."""

    def __init__(self, names: Mapping, read: Callable[[str], torch.Tensor]):
        self.names, self.read = names, read

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.read(name)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def marker(fmt: QuantFormat, prefix: str) -> str | None:
    role = MARKER_ROLE.get(fmt.kind)
    return None if role is None else f"{prefix}.{fmt.name(role)}"


def read_dense(view: TensorView, read_plain: Callable, fmt: QuantFormat, shapes: dict[str, tuple[int, ...]],
               dtype: torch.dtype | None, keep_packed: Callable[[str], bool] = lambda name: False) -> dict:
    """Every non-expert tensor: plain ones as stored (cast to dtype), quantized linears dequantized to the compute
    dtype (dtype, else the embedding's), except those keep_packed(name) names: kept as their PackedWeight (one
    slot), for the host kernels to read as stored (the engine dequantizes them where it cannot)."""
    out, quantized = {}, {}
    for name, shape in shapes.items():
        prefix = name.removesuffix(".weight")
        mark = marker(fmt, prefix) if name.endswith(".weight") and len(shape) == 2 else None
        if mark is not None and mark in view:
            quantized[name] = (prefix, mark)
        elif name in view:
            t = read_plain(name, shape, None)
            if t.is_floating_point() and t.element_size() == 1:  # fp8 values whose scale is not there
                raise CheckpointError(f"tensor {name!r} is {t.dtype} but {mark or 'its scale'!r} is missing")
            out[name] = t if dtype is None or not t.is_floating_point() else t.to(dtype)  # integer tables as stored
        else:
            alt = f" and no {mark!r} ({fmt.kind})" if mark else ""
            raise CheckpointError(f"tensor {name!r} not found{alt} in the checkpoint")
    compute = dtype or out["model.embed_tokens.weight"].dtype
    for name, (prefix, mark) in quantized.items():
        if keep_packed(name):
            w = repack(fmt, view, prefix)
            if tuple(w.shape) != tuple(shapes[name]) or w.num_slots != 1:
                raise CheckpointError(f"tensor {mark!r} holds a {list(w.shape)} matrix, expected {list(shapes[name])}")
            out[name] = w
            continue
        w = dequantize(fmt, view, prefix, dtype=compute)
        if tuple(w.shape) != tuple(shapes[name]):
            raise CheckpointError(f"tensor {mark!r} holds a {list(w.shape)} matrix, expected {list(shapes[name])}")
        out[name] = w
    return out


def mark_or(fmt: QuantFormat, prefix: str) -> str:
    return marker(fmt, prefix) or prefix


def _expect(w: PackedWeight, shape: tuple[int, int], slots: int, what: str) -> PackedWeight:
    if tuple(w.shape) != shape or w.num_slots != slots:
        raise CheckpointError(f"tensor {what!r} holds {w.num_slots} x {list(w.shape)} matrices, expected "
                              f"{slots} x {list(shape)}")
    return w


def read_experts(view: TensorView, family: Family, cfg: ModelConfig, layer: int, fmt: QuantFormat,
                 pin: bool) -> tuple[PackedWeight, PackedWeight, PackedWeight]:
    """(gate [E: I, D], up [E: I, D], down [E: D, I]) of one MoE layer, packed, page-locked if `pin`. fmt: the
    experts' format (QuantFormat.expert_format)."""
    E, I, D = cfg.num_experts, cfg.expert_intermediate, cfg.hidden_size
    if fmt.kind == "mxfp4" and fmt.method != "fp8":  # gpt-oss: every expert in one tensor, gate / up interleaved
        gu_name, down_name = family.fused_tensor(layer, 0), family.fused_tensor(layer, 1)
        gate_up = _expect(repack(fmt, view, gu_name), (2 * I, D), E, gu_name + fmt.name("blocks"))
        down = _expect(repack(fmt, view, down_name), (D, I), E, down_name + fmt.name("blocks"))
        return tuple(stack([w], down_name, pin) for w in (take_rows(gate_up, 0, 2), take_rows(gate_up, 1, 2), down))
    out = []
    for which, shape in enumerate(((I, D), (I, D), (D, I))):
        prefixes = [family.expert_tensor(layer, e, which).removesuffix(".weight") for e in range(E)]
        parts = [_expect(repack(fmt, view, p), shape, 1, mark_or(fmt, p)) for p in prefixes]
        out.append(stack(parts, prefixes[0], pin))
    return tuple(out)
