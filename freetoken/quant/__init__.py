"""Quantized expert formats: parse config.json's quantization_config, dequantize checkpoint tensors, size them."""

from freetoken.quant.config import (
    KINDS,
    QuantFormat,
    load_quant_format,
    parse_quant_config,
)
from freetoken.quant.cost import describe, expert_bytes, stored_bytes
from freetoken.quant.errors import QuantError
from freetoken.quant.fp8 import dequantize_fp8_block, dequantize_fp8_channel
from freetoken.quant.int4 import dequantize_awq, dequantize_gptq
from freetoken.quant.mxfp4 import dequantize_mxfp4
from freetoken.quant.nvfp4 import dequantize_nvfp4
from freetoken.quant.specs import FORMAT_SPECS, format_spec

DEQUANTIZERS = {
    "gptq": dequantize_gptq,
    "awq": dequantize_awq,
    "fp8_block": dequantize_fp8_block,
    "fp8_channel": dequantize_fp8_channel,
    "mxfp4": dequantize_mxfp4,
    "nvfp4": dequantize_nvfp4,
}


def dequantize(fmt: QuantFormat, tensors: dict, prefix: str, **kwargs):
    """Dispatch on fmt.kind; mxfp4 also takes `expert=` (its tensors hold every expert)."""
    return DEQUANTIZERS[fmt.kind](tensors, prefix, fmt, **kwargs)


__all__ = [
    "DEQUANTIZERS",
    "FORMAT_SPECS",
    "KINDS",
    "QuantError",
    "QuantFormat",
    "dequantize",
    "dequantize_awq",
    "dequantize_fp8_block",
    "dequantize_fp8_channel",
    "dequantize_gptq",
    "dequantize_mxfp4",
    "dequantize_nvfp4",
    "describe",
    "expert_bytes", "format_spec", "load_quant_format",
    "parse_quant_config",
    "stored_bytes",
]
