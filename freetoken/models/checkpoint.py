"""Read a local HF checkpoint directory: config.json, safetensors shards (single file or indexed), tensor checks.

Everything is read and checked before a Checkpoint is returned, so a bad file never leaves a half-loaded model
in use: a missing shard, an unreadable or truncated file, a missing tensor or one of the wrong shape raises a
CheckpointError naming the file and the tensor. A checkpoint whose config.json has a `quantization_config` keeps
its routed experts packed (quantized.py).
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from freetoken import hugepages
from freetoken.defaults import usable_cores
from freetoken.models import read_model_config
from freetoken.models.config import CheckpointError, ModelConfig
from freetoken.models.family import Family
from freetoken.models.shard import Shard, ShardError
from freetoken.models.validate import check_dtype, check_values
from freetoken.quant import QuantError, QuantFormat, load_quant_format
from freetoken.quant.head import int8_checkpoint_head

INDEX = "model.safetensors.index.json"


@dataclass(slots=True)
class Checkpoint:
    """dense: every non-expert tensor by its checkpoint name; experts: per MoE layer (gate_up [E, 2I, D]
    with gate rows then up rows, down [E, D, I]) in host memory, or, quantized (`quant` set), per MoE layer
    (gate, up, down) PackedWeights with one slot per expert (gate/up (I, D), down (D, I)). expert_biases (models
    with expert_bias): per MoE layer (gate_up [E, 2I] gate then up, down [E, D]), plain tensors either way."""

    path: Path
    family: Family
    config: ModelConfig
    dense: dict[str, torch.Tensor]
    experts: list[tuple]
    quant: QuantFormat | None = None
    expert_biases: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    notes: tuple[str, ...] = ()  # what loading left out, to say at load (a multimodal checkpoint's vision tower)


def resolve_dir(model: str | Path) -> Path:
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"{path}: not a directory (give the checkpoint directory holding config.json)")
    text = str(model)
    if "/" in text and not text.startswith((".", "/", "~")) and text.count("/") == 1:
        raise CheckpointError(f"{text}: no such local directory, and hub ids cannot be loaded offline; "
                              f"download it first (huggingface-cli download {text} --local-dir DIR) and pass DIR")
    raise CheckpointError(f"{path}: no such checkpoint directory")


def read_config(path: Path) -> tuple[Family, ModelConfig]:
    file = path / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{file}: missing (a checkpoint directory needs config.json)")
    try:
        raw = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file}: expected a JSON object")
    return read_model_config(raw, str(file))


_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def check_layer_count(path: Path, cfg: ModelConfig, where: dict[str, Path]) -> None:
    """config.json's num_hidden_layers against the layers the weights hold: more layers in the weights means the
    config describes another model (the extra layers would be ignored silently). Multi-token-prediction layers
    (DeepSeek-V3's num_nextn_predict_layers) sit after the last one and are allowed."""
    raw = json.loads((path / "config.json").read_text())
    mtp = raw.get("num_nextn_predict_layers") or 0
    layers = {}
    for name, file in where.items():
        m = _LAYER.match(name)
        if m:
            layers.setdefault(int(m.group(1)), (name, file))
    beyond = sorted(l for l in layers if l >= cfg.num_layers + (mtp if isinstance(mtp, int) else 0))
    if beyond:
        name, file = layers[beyond[0]]
        raise CheckpointError(f"{path / 'config.json'}: num_hidden_layers is {cfg.num_layers} but the weights hold "
                              f"{max(layers) + 1} layers (tensor {name!r} in {file.name})")


def shard_map(path: Path) -> dict[str, Path]:
    """tensor name -> the shard file holding it."""
    index = path / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a safetensors index with a 'weight_map' ({e})") from None
        out = {name: path / shard for name, shard in weight_map.items()}
        for name, shard in out.items():
            if not shard.is_file():
                raise CheckpointError(f"{shard}: shard missing (the index {INDEX} maps tensor {name!r} to it)")
        return out
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors weights and no {INDEX}")
    out = {}
    for file in files:
        for name in _open(file).keys():
            out[name] = file
    return out


def _open(file: Path) -> Shard:
    try:
        return Shard(file)
    except ShardError as e:
        raise CheckpointError(f"{file}: unreadable or truncated safetensors file ({e})") from None


class _Reader:
    """Opens each shard once; get() checks the tensor exists and has the expected shape."""

    def __init__(self, path: Path, where: dict[str, Path], text_prefix: str = "",
                 canonical: Callable[[str], str] | None = None, integer: Callable[[str], bool] = lambda name: False,
                 quantized: bool = False):
        """canonical: a stored name -> ours, where the checkpoint names a tensor otherwise (Family.canonical);
        integer: names of integer tables (Family.integer_tensor); quantized: 1-byte float tensors are the quantized
        reader's to judge (a scale may belong to them)."""
        self.path, self.where, self.handles = path, where, {}
        self.integer, self.quantized = integer, quantized
        self.stored: dict[str, str] = {}  # our name -> the stored one (a multimodal text model nests it, ...)
        if text_prefix:
            nested = "model." + text_prefix
            self.stored = {"model." + n[len(nested):]: n for n in where if n.startswith(nested)}
        if canonical is not None:
            self.stored.update({canonical(n): n for n in where if canonical(n) != n})
        if self.stored:
            self.where = {**where, **{ours: where[n] for ours, n in self.stored.items()}}

    def get(self, name: str, shape: tuple[int, ...] | None, dtype: torch.dtype | None,
            out: torch.Tensor | None = None) -> torch.Tensor:
        """A tensor by our name, checked: present, of `shape` (None: any; packed tensors, checked by freetoken.quant)
        and, given a shape, a finite weight of a weight dtype (validate.check_weight). out: a contiguous tensor of
        `shape` to fill (read straight into it when stored in its dtype, cast into it otherwise)."""
        ours = name
        file = self.where.get(name)
        name = self.stored.get(name, name)
        if file is None:
            raise CheckpointError(f"{self.path}: tensor {name!r} not found in the checkpoint")
        if file not in self.handles:
            self.handles[file] = _open(file)
        handle = self.handles[file]
        if name not in handle.keys():
            raise CheckpointError(f"{file}: tensor {name!r} not found (the index says it is here)")
        got = handle.shape(name)
        if shape is not None and got != tuple(shape):
            raise CheckpointError(f"{file}: tensor {name!r} has shape {list(got)}, expected {list(shape)}")
        stored = handle.entries[name][0]
        checked = shape is not None and not (self.quantized and stored.is_floating_point and stored.itemsize == 1)
        if checked:  # a packed tensor's or a quantized reader's 1-byte float: freetoken.quant's to judge
            check_dtype(file, name, stored, self.integer(ours))
        direct = out is not None and stored == out.dtype
        try:
            t = handle.read_into(name, out) if direct else handle.read(name)
        except (ShardError, OSError) as e:
            raise CheckpointError(f"{file}: tensor {name!r} could not be read ({e})") from None
        if checked and t.is_floating_point():
            check_values(file, name, t)
        if out is not None:
            return out if direct else out.copy_(t)
        return t if dtype is None else t.to(dtype)

    def raw(self, name: str) -> torch.Tensor:
        """As stored, any shape (packed tensors: their checks are freetoken.quant's)."""
        return self.get(name, None, None)

    def has(self, name: str) -> bool:
        return name in self.where


def load_checkpoint(model: str | Path, dtype: torch.dtype | None = None, pin: bool | None = None,
                    lm_head: str = "checkpoint") -> Checkpoint:
    """dtype: cast every tensor (None: keep the checkpoint's; packed experts stay packed). pin: page-lock the
    expert store (default: on CUDA). lm_head 'int8': an untied float head quantized as it loads (quant/head.py)."""
    return _load(model, dtype, pin, int8_checkpoint_head if lm_head == "int8" else lambda dense, cfg: None)


def _load(model: str | Path, dtype: torch.dtype | None, pin: bool | None, on_dense) -> Checkpoint:
    """on_dense(dense, cfg): called once the dense tensors are read, before the experts (the int8 head: its float
    copy freed before the experts' memory is taken)."""
    path = resolve_dir(model)
    family, cfg = read_config(path)
    try:
        fmt = load_quant_format(path)
    except QuantError as e:
        raise CheckpointError(str(e)) from None
    reader = _Reader(path, shard_map(path), family.text_prefix, _canonical(family, fmt), family.integer_tensor,
                     quantized=fmt is not None)
    pin = torch.cuda.is_available() if pin is None else pin
    if fmt is not None:
        check_layer_count(path, cfg, reader.where)
        return _load_quantized(path, reader, family, cfg, fmt, dtype, pin, on_dense)
    check_layer_count(path, cfg, reader.where)
    dense = {name: reader.get(name, shape, None if family.integer_tensor(name) else dtype)
             for name, shape in family.dense_tensors(cfg).items()}
    on_dense(dense, cfg)
    with _readers() as pool:
        experts = [_layer_experts(reader, family, cfg, layer, dtype, pin, pool) for layer in cfg.moe_layers]
    return Checkpoint(path, family, cfg, dense, experts, expert_biases=_expert_biases(reader, family, cfg, dtype, pin),
                      notes=_skipped(reader, family))


_FP8_SCALE = re.compile(r"\.scale$")


def _canonical(family: Family, fmt: QuantFormat | None) -> Callable[[str], str] | None:
    """Stored names -> ours: the family's, and FP8 scales stored as `.scale` (DeepSeek-V4's published checkpoints)
    read as `.weight_scale_inv`, as transformers' FP8 loader renames them."""
    if fmt is None or fmt.kind != "fp8_block":
        return family.canonical
    base = family.canonical or (lambda name: name)
    return lambda name: _FP8_SCALE.sub(".weight_scale_inv", base(name))


def _skipped(reader: _Reader, family: Family) -> tuple[str, ...]:
    """One note per skipped prefix that the checkpoint holds tensors under (served text-only)."""
    notes = []
    for prefix in family.skip_prefixes:
        n = sum(name.startswith(prefix) for name in reader.where)
        if n:
            notes.append(f"{reader.path}: {n} tensors under {prefix!r} not loaded ({family.architectures[0]} "
                         f"{family.skip_reason})")
    return tuple(notes)


def _load_quantized(path: Path, reader: _Reader, family: Family, cfg: ModelConfig, fmt: QuantFormat,
                    dtype: torch.dtype | None, pin: bool, on_dense) -> Checkpoint:
    from freetoken.models.quantized import TensorView, read_dense, read_experts

    view = TensorView(reader.where, reader.raw)
    try:
        dense = read_dense(view, reader.get, fmt, family.dense_tensors(cfg), dtype, keep_packed=_KEPT_PACKED.match)
        on_dense(dense, cfg)
        # (one layer at a time: repacking layers in parallel loaded 2.1 GB of GPTQ 1.2x faster but peaked 0.1 GB
        # higher, each thread's temporaries in its own heap)
        experts = [read_experts(view, family, cfg, layer, fmt.expert_format, pin) for layer in cfg.moe_layers]
        biases = _expert_biases(reader, family, cfg, dtype, pin)
    except (QuantError, CheckpointError) as e:
        text = str(e)
        raise CheckpointError(text if text.startswith(str(path)) else f"{path}: {text}") from None
    return Checkpoint(path, family, cfg, dense, experts, fmt, biases, notes=_skipped(reader, family))


# attention projections and the LM head stay packed when quantized (GPTQ and FP8 checkpoints quantize attention, some
# the LM head too): the host kernels read them as stored; the engine dequantizes them where its kernels cannot
# (engine/model.py)
_KEPT_PACKED = re.compile(r"(model\.layers\.\d+\.self_attn\.[qkvo]_proj|lm_head)\.weight$")


def _host(t: torch.Tensor, pin: bool) -> torch.Tensor:
    """Contiguous first: pin_memory() keeps a transposed view's strides, and the device gather copies whole rows."""
    t = t.contiguous()
    return t.pin_memory() if pin else t


def _deinterleave(t: torch.Tensor, dim: int) -> torch.Tensor:
    """gpt-oss's gate / up interleaving (gate = even) -> gate, then up, along dim."""
    idx = torch.arange(t.shape[dim])
    return t.index_select(dim, torch.cat([idx[0::2], idx[1::2]]))


def _readers() -> ThreadPoolExecutor:
    """Threads that read experts in parallel: loading is bound by the kernel faulting the stacks' fresh pages in
    (zeroing them), not by the page cache, so it scales with cores (measured, 48-layer 7.6 GB bf16 random
    Qwen3-MoE on 2 cores, a fresh process each: 10.4-13.1 s -> 6.9-8.8 s)."""
    return ThreadPoolExecutor(max_workers=min(8, usable_cores()), thread_name_prefix="ft-load")


def _layer_experts(reader: _Reader, family: Family, cfg: ModelConfig, layer: int, dtype, pin: bool,
                   pool: ThreadPoolExecutor):
    E, I, D = cfg.num_experts, cfg.expert_intermediate, cfg.hidden_size
    fused_gu, fused_down = family.fused_tensor(layer, 0), family.fused_tensor(layer, 1)
    if reader.has(fused_gu) and not reader.has(family.expert_tensor(layer, 0, 0)):
        gu_shape, down_shape = family.fused_shapes(cfg)
        gate_up = reader.get(fused_gu, gu_shape, dtype)
        down = reader.get(fused_down, down_shape, dtype)
        if family.expert_layout == "gpt_oss":  # x @ W with interleaved columns -> our W rows, gate then up
            gate_up, down = _deinterleave(gate_up.transpose(1, 2), 1), down.transpose(1, 2)
        return _host(gate_up, pin), _host(down, pin)
    first = reader.get(family.expert_tensor(layer, 0, 0), (I, D), dtype)
    gate_up = hugepages.empty((E, 2 * I, D), first.dtype, pin)
    down = hugepages.empty((E, D, I), first.dtype, pin)
    gate_up[0, :I] = first

    def read(e: int) -> None:  # straight into the expert's rows of the stack
        if e:
            reader.get(family.expert_tensor(layer, e, 0), (I, D), dtype, out=gate_up[e, :I])
        reader.get(family.expert_tensor(layer, e, 1), (I, D), dtype, out=gate_up[e, I:])
        reader.get(family.expert_tensor(layer, e, 2), (D, I), dtype, out=down[e])

    list(pool.map(read, range(E)))  # (the first failure raises here)
    return gate_up, down


def _expert_biases(reader: _Reader, family: Family, cfg: ModelConfig, dtype, pin: bool):
    """Per MoE layer (gate_up [E, 2I] gate then up, down [E, D]), or None for a model without expert biases."""
    if not cfg.expert_bias:
        return None
    E, I, D = cfg.num_experts, cfg.expert_intermediate, cfg.hidden_size
    out = []
    for layer in cfg.moe_layers:
        gate_up = reader.get(family.bias_tensor(layer, 0), (E, 2 * I), dtype)
        if family.expert_layout == "gpt_oss":
            gate_up = _deinterleave(gate_up, 1)
        out.append((_host(gate_up, pin), _host(reader.get(family.bias_tensor(layer, 1), (E, D), dtype), pin)))
    return out
