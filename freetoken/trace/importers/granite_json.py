"""Granite trace dumps: {"model", "num_layers", "num_experts", "top_k", "prompts": {name: {"prompt_len",
"prefill": [positions][L][K], "decode": [steps][L][K]}}}.

One request per prompt in file order: its prefill positions (phase 0), then its decode steps (phase 1). No gates.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from freetoken.trace.format import DECODE, PREFILL, RoutingTrace, TraceError


def import_granite_json(path: str | Path) -> RoutingTrace:
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise TraceError(f"{path}: expected a JSON object at the top level")
    L, E, K = (_positive(path, data, key) for key in ("num_layers", "num_experts", "top_k"))
    prompts = data.get("prompts")
    if not isinstance(prompts, dict) or not prompts:
        raise TraceError(f"{path}: field 'prompts' must be a non-empty object of prompt name -> routes")
    experts, request, phase = [], [], []
    for r, (name, prompt) in enumerate(prompts.items()):
        if not isinstance(prompt, dict):
            raise TraceError(f"{path}: field 'prompts.{name}' must be an object")
        for key, ph in (("prefill", PREFILL), ("decode", DECODE)):
            arr = _routes(path, prompt, f"prompts.{name}.{key}", key, L, K)  # [n, L, K]
            experts.append(arr)
            request.append(np.full(len(arr), r, np.int32))
            phase.append(np.full(len(arr), ph, np.int8))
        n_prefill = len(experts[-2])
        if "prompt_len" in prompt and prompt["prompt_len"] != n_prefill:
            raise TraceError(f"{path}: field 'prompts.{name}.prompt_len' is {prompt['prompt_len']!r} but "
                             f"'prefill' has {n_prefill} positions")
    ex = np.concatenate(experts)
    if ex.size and (ex.min() < 0 or ex.max() >= E):
        t = int(np.argwhere((ex < 0) | (ex >= E))[0][0])
        raise TraceError(f"{path}: field 'prompts' holds expert id outside [0, {E}) at token {t}")
    return RoutingTrace(ex.astype(np.int16), E, model=str(data.get("model", "granite-3.0-1b-a400m")),
                        source=f"granite_json:{path.name}", request=np.concatenate(request),
                        phase=np.concatenate(phase),
                        extra={"dropped_tokens": "0", "request_names": json.dumps(list(prompts))})


def _positive(path: Path, data: dict, key: str) -> int:
    v = data.get(key)
    if type(v) is not int or v <= 0:
        raise TraceError(f"{path}: field '{key}' must be a positive integer, got {v!r}")
    return v


def _routes(path: Path, prompt: dict, where: str, key: str, L: int, K: int) -> np.ndarray:
    if key not in prompt:
        raise TraceError(f"{path}: field '{where}' is missing")
    try:
        arr = np.asarray(prompt[key])
    except ValueError:  # ragged nesting
        arr = None
    if arr is None or arr.dtype.kind not in "iu" or arr.ndim != 3 or arr.shape[1:] != (L, K):
        if arr is not None and arr.size == 0:
            return np.zeros((0, L, K), np.int64)
        got = "ragged lists" if arr is None else f"shape {arr.shape}, dtype {arr.dtype}"
        raise TraceError(f"{path}: field '{where}' must be [positions][{L} layers][{K}] integers, got {got}")
    return arr
