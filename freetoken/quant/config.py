"""`QuantFormat`: what a checkpoint's config.json `quantization_config` says about its expert weights.

One parser for every exporter, so the dequantizers and the cost model read typed fields, never raw dicts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freetoken.quant.errors import QuantError

KINDS = ("gptq", "awq", "fp8_block", "fp8_channel", "mxfp4", "nvfp4")
INT4_GROUP_SIZES = (32, 64, 128, -1)  # -1: one group over the whole input dim (per output channel)


@dataclass(frozen=True)
class QuantFormat:
    """Layout of one quantized weight matrix [out, in], as stored by its exporter.

    kind: one of KINDS. group_size: input elements per scale (int4: 32/64/128 or -1; mxfp4 32; nvfp4 16).
    sym: int4 symmetric (zero point fixed at 8). zero_offset: GPTQ v1 checkpoints store zero - 1 (1), v2 and
    AWQ the zero itself (0). block: FP8 (rows, cols) per weight_scale_inv entry. global_scale: NVFP4 per-tensor
    scale is "divide" (compressed-tensors `weight_global_scale` = 448*6/amax) or "multiply" (ModelOpt
    `weight_scale_2` = amax/(448*6)). names: checkpoint tensor suffixes, by role.
    """

    kind: str
    method: str
    bits: int
    group_size: int
    sym: bool = True
    desc_act: bool = False
    zero_offset: int = 0
    block: tuple[int, int] | None = None
    global_scale: str | None = None
    names: tuple[tuple[str, str], ...] = ()
    experts: QuantFormat | None = None  # the routed experts' format where it differs (DeepSeek-V4: FP4 experts)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise QuantError(f"quantization kind {self.kind!r}: valid kinds are {list(KINDS)}")
        if self.kind in ("gptq", "awq") and self.group_size not in INT4_GROUP_SIZES:
            raise QuantError(f"quantization_config.group_size = {self.group_size}: valid int4 group sizes are "
                             f"{list(INT4_GROUP_SIZES)}")
        if self.global_scale not in (None, "divide", "multiply"):
            raise QuantError(f"global_scale {self.global_scale!r}: valid are 'divide', 'multiply'")

    def name(self, role: str) -> str:
        return dict(self.names)[role]

    @property
    def expert_format(self) -> QuantFormat:
        """The format the routed experts are stored in."""
        return self.experts or self

    def check_dims(self, out_dim: int, in_dim: int, what: str = "weight") -> None:
        """Fail naming the tensor when a group/block/packing size does not divide its dims."""
        pack_out = 8 if self.kind == "awq" else 1
        pack_in = {"gptq": 8, "mxfp4": 32, "nvfp4": 16}.get(self.kind, 1)
        if self.kind in ("gptq", "awq") and self.group_size > 0 and in_dim % self.group_size:
            raise QuantError(f"{what}: group_size {self.group_size} does not divide the input dim {in_dim}")
        if in_dim % pack_in or out_dim % pack_out or (self.kind == "gptq" and out_dim % 8):
            raise QuantError(f"{what}: dims [{out_dim}, {in_dim}] do not fit the {self.kind} packing")


def _field(cfg: dict[str, Any], key: str, default: Any = KeyError) -> Any:
    if key in cfg:
        return cfg[key]
    if default is KeyError:
        raise QuantError(f"quantization_config.{key} is missing")
    return default


def _int4_bits(cfg: dict[str, Any]) -> None:
    bits = _field(cfg, "bits", 4)
    if bits != 4:
        raise QuantError(f"quantization_config.bits = {bits}: only 4-bit int is supported")


def _gptq(cfg: dict[str, Any]) -> QuantFormat:
    _int4_bits(cfg)
    fmt = cfg.get("checkpoint_format", "gptq")
    if fmt not in ("gptq", "gptq_v2"):
        raise QuantError(f"quantization_config.checkpoint_format = {fmt!r}: valid are 'gptq', 'gptq_v2'")
    return QuantFormat("gptq", "gptq", 4, int(_field(cfg, "group_size")), sym=bool(cfg.get("sym", True)),
                       desc_act=bool(cfg.get("desc_act", False)), zero_offset=1 if fmt == "gptq" else 0,
                       names=_INT4_NAMES)


def _auto_round(cfg: dict[str, Any]) -> QuantFormat:
    packing = str(cfg.get("packing_format", "auto_round:auto_gptq"))
    if "awq" in packing:
        return _awq({**cfg, "zero_point": not cfg.get("sym", True)} | {"method": "auto-round"})
    if "gptqmodel" in packing:  # gptq_v2 layout: zeros stored as is
        return _gptq({**cfg, "checkpoint_format": "gptq_v2"})
    return _gptq({**cfg, "checkpoint_format": "gptq"})


def _awq(cfg: dict[str, Any]) -> QuantFormat:
    _int4_bits(cfg)
    version = str(cfg.get("version", "gemm")).lower()
    if version != "gemm":
        raise QuantError(f"quantization_config.version = {version!r}: only the AWQ 'gemm' packing is supported")
    return QuantFormat("awq", cfg.get("method", "awq"), 4, int(_field(cfg, "group_size")),
                       sym=not bool(cfg.get("zero_point", True)), names=_INT4_NAMES)


def _fp8(cfg: dict[str, Any]) -> QuantFormat:
    fmt = cfg.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise QuantError(f"quantization_config.fmt = {fmt!r}: only 'e4m3' is supported")
    block = _field(cfg, "weight_block_size")
    if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(int(b) > 0 for b in block)):
        raise QuantError(f"quantization_config.weight_block_size = {block!r}: expected [rows, cols]")
    scale_fmt = cfg.get("scale_fmt") or "float"
    if scale_fmt not in ("float", "ue8m0"):
        raise QuantError(f"quantization_config.scale_fmt = {scale_fmt!r}: valid are 'float', 'ue8m0'")
    expert_dtype = cfg.get("expert_dtype") or "fp8"
    if expert_dtype not in ("fp8", "fp4"):
        raise QuantError(f"quantization_config.expert_dtype = {expert_dtype!r}: valid are 'fp8', 'fp4'")
    names = (("weight", "weight"), ("scale", "weight_scale_inv"))
    # DeepSeek-V4's FP4 experts: two e2m1 values per byte ([out, in / 2] int8), one e8m0 scale per 32 inputs
    experts = QuantFormat("mxfp4", "fp8", 4, 32, names=names) if expert_dtype == "fp4" else None
    return QuantFormat("fp8_block", "fp8", 8, 0, block=(int(block[0]), int(block[1])), names=names, experts=experts)


def _fbgemm_fp8(cfg: dict[str, Any]) -> QuantFormat:
    return QuantFormat("fp8_channel", "fbgemm_fp8", 8, 0, names=(("weight", "weight"), ("scale", "weight_scale")))


def _mxfp4(cfg: dict[str, Any]) -> QuantFormat:
    return QuantFormat("mxfp4", "mxfp4", 4, 32, names=(("blocks", "_blocks"), ("scales", "_scales")))


def _modelopt(cfg: dict[str, Any]) -> QuantFormat:
    algo = str(_field(cfg, "quant_algo")).upper()
    if algo != "NVFP4":
        raise QuantError(f"quantization_config.quant_algo = {algo!r}: only 'NVFP4' is supported for modelopt")
    group = int(cfg.get("group_size", 16))
    if group != 16:
        raise QuantError(f"quantization_config.group_size = {group}: NVFP4 uses 16")
    return QuantFormat("nvfp4", "modelopt", 4, 16, global_scale="multiply",
                       names=(("packed", "weight"), ("scale", "weight_scale"), ("global", "weight_scale_2")))


def _compressed_tensors(cfg: dict[str, Any]) -> QuantFormat:
    groups = _field(cfg, "config_groups")
    if not isinstance(groups, dict) or not groups:
        raise QuantError("quantization_config.config_groups: expected a non-empty dict")
    weights = {}
    for gname, group in groups.items():
        w = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(w, dict):
            raise QuantError(f"quantization_config.config_groups.{gname}.weights is missing")
        weights[gname] = w
    distinct = {repr(sorted(w.items())) for w in weights.values()}
    if len(distinct) > 1:
        raise QuantError(f"quantization_config.config_groups: groups {list(weights)} quantize weights differently; "
                         "one weight scheme per checkpoint is supported")
    gname, w = next(iter(weights.items()))
    where = f"quantization_config.config_groups.{gname}.weights"
    fmt = cfg.get("format", "")
    num_bits, typ, strategy = w.get("num_bits"), w.get("type"), w.get("strategy")
    if fmt == "nvfp4-pack-quantized" or (num_bits == 4 and typ == "float" and w.get("group_size") == 16):
        if not w.get("symmetric", True):
            raise QuantError(f"{where}.symmetric = false: NVFP4 is symmetric")
        return QuantFormat("nvfp4", "compressed-tensors", 4, 16, global_scale="divide",
                           names=(("packed", "weight_packed"), ("scale", "weight_scale"),
                                  ("global", "weight_global_scale")))
    if num_bits == 8 and typ == "float":
        names = (("weight", "weight"), ("scale", "weight_scale"))
        if strategy == "channel":
            return QuantFormat("fp8_channel", "compressed-tensors", 8, 0, names=names)
        if strategy == "block":
            block = w.get("block_structure")
            if not (isinstance(block, (list, tuple)) and len(block) == 2):
                raise QuantError(f"{where}.block_structure = {block!r}: expected [rows, cols]")
            return QuantFormat("fp8_block", "compressed-tensors", 8, 0, block=(int(block[0]), int(block[1])),
                               names=names)
        raise QuantError(f"{where}.strategy = {strategy!r}: FP8 supports 'channel' and 'block'")
    raise QuantError(f"{where}: num_bits={num_bits} type={typ!r} format={fmt!r} is not a supported scheme "
                     "(nvfp4-pack-quantized, float-quantized fp8 channel/block)")


_INT4_NAMES = (("qweight", "qweight"), ("qzeros", "qzeros"), ("scales", "scales"), ("g_idx", "g_idx"))

PARSERS = {
    "gptq": _gptq,
    "auto-round": _auto_round,
    "auto_round": _auto_round,
    "awq": _awq,
    "fp8": _fp8,
    "fbgemm_fp8": _fbgemm_fp8,
    "mxfp4": _mxfp4,
    "modelopt": _modelopt,
    "compressed-tensors": _compressed_tensors,
}


def parse_quant_config(cfg: dict[str, Any]) -> QuantFormat:
    """config.json dict (or its `quantization_config` alone) -> QuantFormat; errors name the bad field."""
    if not isinstance(cfg, dict):
        raise QuantError(f"quantization_config: expected a dict, got {type(cfg).__name__}")
    qc = cfg.get("quantization_config", cfg)
    if not isinstance(qc, dict):
        raise QuantError("quantization_config: expected a dict")
    method = qc.get("quant_method")
    if method is None:
        raise QuantError("quantization_config.quant_method is missing")
    if method not in PARSERS:
        raise QuantError(f"quantization_config.quant_method = {method!r}: valid methods are {sorted(PARSERS)}")
    return PARSERS[method](qc)


def load_quant_format(model_dir: str | Path) -> QuantFormat | None:
    """QuantFormat of a local checkpoint from its config.json; None when the checkpoint is not quantized."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise QuantError(f"{path}: cannot read config ({e})") from None
    if "quantization_config" not in cfg:
        return None
    try:
        return parse_quant_config(cfg)
    except QuantError as e:
        raise QuantError(f"{path}: {e}") from None
