"""Expert formats by short name ("gptq-g128", "fp8-block", "nvfp4"): what a user types where no checkpoint is at
hand (model cards, `ft bench quant`). Each name is the quantization_config an exporter writes, so it goes through
the same parser as a real checkpoint."""

from __future__ import annotations

from freetoken.quant.config import QuantFormat, parse_quant_config
from freetoken.quant.errors import QuantError

FORMAT_SPECS: dict[str, dict] = {
    "gptq-g32": {"quant_method": "gptq", "bits": 4, "group_size": 32},
    "gptq-g64": {"quant_method": "gptq", "bits": 4, "group_size": 64},
    "gptq-g128": {"quant_method": "gptq", "bits": 4, "group_size": 128},
    "gptq-g128-act": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True},
    "awq-g64": {"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemm"},
    "awq-g128": {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"},
    "fp8-block": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},  # DeepSeek-V3
    "fp8-channel": {"quant_method": "fbgemm_fp8"},
    "mxfp4": {"quant_method": "mxfp4"},  # gpt-oss
    "nvfp4": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": {
        "group_0": {"weights": {"num_bits": 4, "type": "float", "group_size": 16, "symmetric": True}}}},
}


def format_spec(name: str) -> QuantFormat:
    try:
        cfg = FORMAT_SPECS[name]
    except KeyError:
        raise QuantError(f"unknown expert format {name!r}; valid: {', '.join(FORMAT_SPECS)}") from None
    return parse_quant_config(cfg)
