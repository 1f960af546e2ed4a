"""DeepSeek-V2-Lite router picks packed as numpy arrays: experts int8 [T, L, K], offsets int64 [P + 1] (prompt i is
experts[offsets[i]:offsets[i + 1]]), prompt_ids int32 [P]. One forward pass per prompt: all prefill.

Vectorised end to end: 192k tokens import in well under a second.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from freetoken.trace.format import RoutingTrace, TraceError

NUM_EXPERTS = 64  # routed experts of DeepSeek-V2-Lite; the 2 shared experts are not logged


def import_deepseek_npz(path: str | Path, *, num_experts: int = NUM_EXPERTS) -> RoutingTrace:
    path = Path(path)
    if path.is_file() and not zipfile.is_zipfile(path):  # np.load would read a .npy array, or try pickle
        raise TraceError(f"{path}: not a .npz archive (not a zip file; a .npz holds experts, offsets, prompt_ids)")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in ("experts", "offsets", "prompt_ids") if name in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise TraceError(f"{path}: not a readable .npz archive ({e})") from None
    for name in ("experts", "offsets", "prompt_ids"):
        if name not in arrays:
            raise TraceError(f"{path}: field '{name}' is missing")
    experts, offsets, prompt_ids = arrays["experts"], arrays["offsets"], arrays["prompt_ids"]
    if experts.ndim != 3 or experts.dtype.kind not in "iu":
        raise TraceError(f"{path}: field 'experts' must be an integer [tokens, layers, top_k] array, "
                         f"got {experts.dtype} {experts.shape}")
    T = experts.shape[0]
    if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or len(offsets) < 2:
        raise TraceError(f"{path}: field 'offsets' must be a 1-d integer array of prompt boundaries")
    if offsets[0] != 0 or offsets[-1] != T or (np.diff(offsets) < 0).any():
        raise TraceError(f"{path}: field 'offsets' must rise from 0 to {T} (the token count), "
                         f"got {offsets[0]} .. {offsets[-1]}")
    if prompt_ids.shape != (len(offsets) - 1,):
        raise TraceError(f"{path}: field 'prompt_ids' has {len(prompt_ids)} entries; 'offsets' bounds "
                         f"{len(offsets) - 1} prompts")
    lengths = np.diff(offsets)
    request = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)  # [T]
    if T and (experts.min() < 0 or experts.max() >= num_experts):
        raise TraceError(f"{path}: field 'experts' holds ids outside [0, {num_experts})")
    span = np.arange(int(prompt_ids.min()), int(prompt_ids.max()) + 1) if len(prompt_ids) else np.zeros(0)
    missing = np.setdiff1d(span, prompt_ids)
    extra = {"dropped_tokens": "0", "empty_prompts": str(int((lengths == 0).sum())),
             "missing_prompt_ids": ",".join(map(str, missing[:50].tolist()))}
    return RoutingTrace(experts.astype(np.int16), num_experts, model="deepseek-v2-lite",
                        source=f"deepseek_npz:{path.name}", request=request, extra=extra)
