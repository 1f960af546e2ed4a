"""Architecture families: config.json + tensor names -> ModelConfig and the shared decoder blocks."""

from __future__ import annotations

from freetoken.models import (deepseek, deepseek_v4, glm4_moe, glm_moe_dsa, gpt_oss, minimax_m2, mixtral, olmoe,
                              qwen2_moe, qwen3_moe, qwen3_next)
from freetoken.models.config import CheckpointError, ConfigReader, ModelConfig
from freetoken.models.family import Family

FAMILIES: dict[str, Family] = {f.name: f for f in (qwen3_moe.FAMILY, mixtral.FAMILY, olmoe.FAMILY, qwen2_moe.FAMILY,
                                                   gpt_oss.FAMILY, deepseek.FAMILY, qwen3_next.FAMILY,
                                                   qwen3_next.FAMILY_3_5, qwen3_next.FAMILY_3_5_MULTIMODAL,
                                                   glm4_moe.FAMILY, minimax_m2.FAMILY, glm_moe_dsa.FAMILY,
                                                   deepseek_v4.FAMILY)}
ARCHITECTURES: dict[str, Family] = {arch: f for f in FAMILIES.values() for arch in f.architectures}


def family_for(raw: dict, path: str) -> Family:
    """The family of a parsed config.json, by its architectures list (then model_type)."""
    archs = raw.get("architectures") or []
    for arch in archs:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    model_type = raw.get("model_type")
    if not archs and model_type in FAMILIES:
        return FAMILIES[model_type]
    got = ", ".join(archs) if archs else f"model_type {model_type!r}"
    raise CheckpointError(f"{path}: unknown architecture {got}; supported: {', '.join(sorted(ARCHITECTURES))}")


def read_model_config(raw: dict, path: str) -> tuple[Family, ModelConfig]:
    from freetoken.models.validate import validate_config

    check_dtype(raw, path)
    validate_config(raw, path)
    family = family_for(raw, path)
    try:
        return family, family.read_config(ConfigReader(raw, path))
    except CheckpointError as e:  # the config records' own checks say "config.json: ...": name which one
        message = str(e)
        if message.startswith("config.json: ") and path != "config.json":
            raise CheckpointError(f"{path}: {message.removeprefix('config.json: ')}") from None
        raise


def check_dtype(raw: dict, path: str) -> None:
    """config.json's "dtype" (or older "torch_dtype"), when given, must name a torch dtype."""
    import torch

    for field in ("dtype", "torch_dtype"):
        value = raw.get(field)
        if value is not None and not (isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype)):
            raise CheckpointError(f"{path}: field {field!r} is {value!r}, not a torch dtype name (bfloat16, float16, "
                                  f"float32, ...)")


__all__ = ["ARCHITECTURES", "CheckpointError", "FAMILIES", "Family", "ModelConfig", "family_for",
           "read_model_config"]
