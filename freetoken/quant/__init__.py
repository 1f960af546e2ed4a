"""Quantized expert formats: parse config.json's quantization_config, dequantize checkpoint tensors, size them.

Importing the package does not import torch (the simulator sizes experts from configs alone); the tensor
modules (repack, packed, layout, bits) do.
"""

from freetoken.quant.config import (
    KINDS,
    QuantFormat,
    load_quant_format,
    parse_quant_config,
)
from freetoken.quant.cost import describe, expert_bytes, stored_bytes
from freetoken.quant.errors import QuantError
from freetoken.quant.specs import FORMAT_SPECS, format_spec


def dequantize(fmt: QuantFormat, tensors: dict, prefix: str, expert: int = 0, dtype=None):
    """One matrix's checkpoint tensors -> [out, in] (mxfp4: its tensors hold every expert; pick `expert`), through
    the packed layout the engine keeps (repack, then PackedWeight.to_float): one decoder for tests and kernels.
    dtype: a torch dtype, float32 when None."""
    import torch

    from freetoken.quant.repack import repack

    w = repack(fmt, tensors, prefix)
    if not 0 <= expert < w.num_slots:
        raise QuantError(f"{prefix}: expert {expert} outside [0, {w.num_slots})")
    return w.to_float(expert).to(torch.float32 if dtype is None else dtype)


__all__ = [
    "FORMAT_SPECS",
    "KINDS",
    "QuantError",
    "QuantFormat",
    "dequantize",
    "describe",
    "expert_bytes", "format_spec", "load_quant_format",
    "parse_quant_config",
    "stored_bytes",
]
