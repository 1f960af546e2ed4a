"""A GPTQ int4 checkpoint written from a bf16 one by round-to-nearest: the same weights, in the layout GPTQ
exporters write (checkpoint_format gptq_v2), so the engine's int4 path can be timed against llama.cpp's Q4_0 on the
weights both were made from.

Quantized, as GPTQ checkpoints of these models are: attention q/k/v/o and every expert projection (routed and
shared); the router (`mlp.gate`), the embedding, the norms and lm_head stay as they are (modules_to_not_convert).
`lm_head=True` quantizes the LM head too (as GPTQModel's lm_head option does): the int4 weights then read about the
bytes llama.cpp's Q4_0 file does (whose output matrix is Q6_K).

Per group of `group` inputs of an output row (asymmetric min-max, the range widened to hold 0 as GPTQ's quantizer
does): scale = (max - min) / 15, zero = round(-min / scale), q = clamp(round(w / scale) + zero, 0, 15); the scale
is stored in fp16 and w' = (q - zero) * scale. Layout: qweight [K/8, N] int32 (nibble i of row r: input 8r + i),
qzeros [G, N/8] int32 (nibble i of column c: output 8c + i, the zero itself: v2), scales [G, N] fp16.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import torch

GROUP = 128
QUANTIZED = re.compile(r"\.(self_attn\.[qkvo]_proj|mlp\.experts\.\d+\.(gate|up|down)_proj|"
                       r"mlp\.shared_expert\.(gate|up|down)_proj)\.weight$")
NOT_CONVERTED = ["mlp.gate", "lm_head"]
SMALL_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def rtn_int4(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q [N, K] uint8 in 0..15, zero [N, G] uint8, scale [N, G] fp32) by the rule above."""
    N, K = w.shape
    if K % group:
        raise ValueError(f"in dim {K} is not a multiple of the group size {group}")
    wf = w.float().reshape(N, K // group, group)
    lo = wf.amin(-1).clamp(max=0)
    hi = wf.amax(-1).clamp(min=0)
    flat = hi == lo  # an all-zero group: GPTQ's [-1, 1]
    lo, hi = torch.where(flat, -1.0, lo), torch.where(flat, 1.0, hi)
    scale = (hi - lo) / 15
    zero = torch.round(-lo / scale).clamp(0, 15)
    q = (torch.round(wf / scale[..., None]) + zero[..., None]).clamp(0, 15)
    return q.to(torch.uint8).reshape(N, K), zero.to(torch.uint8), scale


def _pack8(nibbles: np.ndarray) -> np.ndarray:
    """[..., 8] values 0..15 -> [...] int32, value i in bits 4i..4i+3."""
    shifts = (np.arange(8, dtype=np.uint32) * 4)
    return np.bitwise_or.reduce(nibbles.astype(np.uint32) << shifts, axis=-1).view(np.int32)


def pack_gptq(q: torch.Tensor, zero: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor]:
    """rtn_int4's output -> {'qweight' [K/8, N], 'qzeros' [G, N/8], 'scales' [G, N] fp16}."""
    N, K = q.shape
    G = zero.shape[1]
    if N % 8:
        raise ValueError(f"out dim {N} is not a multiple of 8 (qzeros packing)")
    qk = q.numpy().T.reshape(K // 8, 8, N).transpose(0, 2, 1)  # [K/8, N, 8]: inputs 8r..8r+7 of output n
    zg = zero.numpy().T.reshape(G, N // 8, 8)  # [G, N/8, 8]: outputs 8c..8c+7 of group g
    return {"qweight": torch.from_numpy(np.ascontiguousarray(_pack8(qk))),
            "qzeros": torch.from_numpy(np.ascontiguousarray(_pack8(zg))),
            "scales": scale.t().contiguous().to(torch.float16)}


def quantizable(name: str, shape: tuple[int, ...], group: int = GROUP, lm_head: bool = False) -> bool:
    ok = bool(QUANTIZED.search(name)) or (lm_head and name == "lm_head.weight")
    return ok and len(shape) == 2 and shape[1] % group == 0 and shape[0] % 8 == 0


def write_gptq(src: Path, dst: Path, group: int = GROUP, log: Callable[[str], None] = lambda s: None,
               lm_head: bool = False) -> Path:
    """The bf16 checkpoint `src` as a GPTQ v2 int4 g`group` checkpoint in `dst` (shard for shard); lm_head: quantize
    the LM head too."""
    from safetensors.torch import save_file

    from freetoken.models.shard import Shard

    src, dst = Path(src), Path(dst)
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{src}: no .safetensors file to quantize")
    dst.mkdir(parents=True, exist_ok=True)
    renamed: dict[str, list[str]] = {}
    for i, file in enumerate(files):
        log(f"GPTQ int4 g{group}: {file.name} ({i + 1} of {len(files)})")
        shard, out = Shard(file), {}
        for name in shard.keys():
            t = shard.read(name)
            if quantizable(name, tuple(t.shape), group, lm_head):
                prefix = name.removesuffix(".weight")
                for part, packed in pack_gptq(*rtn_int4(t, group)).items():
                    out[f"{prefix}.{part}"] = packed
                renamed[name] = [f"{prefix}.{p}" for p in ("qweight", "qzeros", "scales")]
            else:
                out[name] = t
        save_file(out, str(dst / file.name), metadata={"format": "pt"})
    index = src / "model.safetensors.index.json"
    if index.is_file():
        meta = json.loads(index.read_text())
        meta["weight_map"] = {new: f for name, f in meta["weight_map"].items() for new in renamed.get(name, [name])}
        (dst / index.name).write_text(json.dumps(meta, indent=1))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group, "sym": False,
                                     "desc_act": False, "checkpoint_format": "gptq_v2",
                                     "modules_to_not_convert": [m for m in NOT_CONVERTED
                                                                if not (lm_head and m == "lm_head")]}
    (dst / "config.json").write_text(json.dumps(config, indent=1))
    for name in SMALL_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)
    return dst
