"""Qwen1.5-MoE route logs from a vLLM hook: a {"type": "meta"} line, then {"type": "route", "req_id", "token_idx",
"layer", "topk_ids", "topk_weights"} rows of one layer.

token_idx is the row within one forward pass, so a pass ends where token_idx stops increasing. A pass in which
every row repeats one route and that has at least PROFILE_MIN_ROWS rows is vLLM's dummy profiling run: it starts a
new engine run and is dropped by default (counted in extra["dropped_tokens"]). Requests are (req_id, run) in
first-appearance order; the first real pass of a run is its prefill, later passes are decode steps (one token per
row, batched sequences interleaved).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from freetoken.trace.format import DECODE, PREFILL, RoutingTrace, TraceError
from freetoken.trace.importers.rows import Row, check_picks, read_rows

PROFILE_MIN_ROWS = 256
PROFILE_PASSES = ("drop", "keep")
KNOWN_EXPERTS = {"Qwen/Qwen1.5-MoE-A2.7B-Chat": 60, "Qwen/Qwen1.5-MoE-A2.7B": 60}


def import_qwen_routes(path: str | Path, *, profile_passes: str = "drop",
                       num_experts: int | None = None) -> RoutingTrace:
    # N = route rows, K = top-k
    path = Path(path)
    if profile_passes not in PROFILE_PASSES:
        raise ValueError(f"profile_passes: unknown {profile_passes!r}; valid: {', '.join(PROFILE_PASSES)}")
    meta: dict = {}
    req_ids, tok, layers, ids, weights, lines = [], [], [], [], [], []
    k = None
    for lineno, raw in read_rows(path):
        kind = raw.get("type")
        if kind == "meta":
            meta = meta or raw
            continue
        row = Row(path, lineno, raw)
        if kind != "route":
            raise row.fail("type", f"must be 'meta' or 'route', got {kind!r}")
        req_ids.append(row.key("req_id"))
        tok.append(row.int("token_idx"))
        layers.append(row.int("layer"))
        if k is None:
            k = meta.get("top_k") if type(meta.get("top_k")) is int else row.top_k("topk_ids")
        ids.append(row.ints("topk_ids", k))
        weights.append(row.floats("topk_weights", k))
        lines.append(lineno)
    if not lines:
        raise TraceError(f"{path}: no route rows")
    lines = np.asarray(lines, np.int64)
    layer_ids = sorted(set(layers))
    if len(layer_ids) > 1:
        raise TraceError(f"{path}: field 'layer' holds layers {layer_ids[:8]}; this format logs one layer")
    ids = np.asarray(ids, np.int64)  # [N, K]
    model = str(meta.get("model_id", "qwen1.5-moe-a2.7b"))
    E = num_experts or meta.get("num_experts") or KNOWN_EXPERTS.get(model) or int(ids.max()) + 1
    check_picks(path, ids, lines, E, "topk_ids")

    # passes, profiling runs, runs
    tok = np.asarray(tok, np.int64)
    starts = np.flatnonzero(np.r_[True, tok[1:] <= tok[:-1]])  # first row of each pass
    ends = np.r_[starts[1:], len(tok)]
    same_as_first = (ids == ids[np.repeat(starts, ends - starts)]).all(axis=1)  # [N]
    pass_of = np.repeat(np.arange(len(starts)), ends - starts)  # [N]
    uniform = np.bincount(pass_of, weights=~same_as_first, minlength=len(starts)) == 0
    profile = uniform & (ends - starts >= PROFILE_MIN_ROWS)  # [P]
    run = np.cumsum(profile)  # [P] a profiling pass opens a new engine run
    first_real = ~profile & np.r_[True, profile[:-1]]
    pass_phase = np.where(profile | first_real, PREFILL, DECODE).astype(np.int8)
    keep = np.ones(len(tok), bool) if profile_passes == "keep" else ~profile[pass_of]

    names: dict[tuple, int] = {}
    run_of = run[pass_of]
    request = np.asarray([names.setdefault((r, int(u)), len(names)) for r, u in zip(req_ids, run_of.tolist())],
                         np.int32)
    kept_req = request[keep]
    _, first = np.unique(kept_req, return_index=True)
    renumber = np.full(len(names), -1, np.int32)
    renumber[kept_req[np.sort(first)]] = np.arange(len(first), dtype=np.int32)
    extra = {
        "dropped_tokens": str(int((~keep).sum())),
        "dropped_why": "vLLM profiling passes (one route repeated over a whole pass)",
        "layers_logged": json.dumps(layer_ids),
    }
    return RoutingTrace(ids[keep][:, None, :].astype(np.int16), int(E), model=model,
                        source=f"qwen_routes:{path.name}", request=renumber[kept_req],
                        phase=pass_phase[pass_of][keep],
                        gates=np.asarray(weights, np.float64)[keep][:, None, :].astype(np.float16), extra=extra)
