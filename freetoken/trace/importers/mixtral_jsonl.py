"""Mixtral router logs: one JSON row per (problem, token, layer).

Row: {"dataset", "problem_id", "layer", "experts": [K ids], "gating_probs": [K], "token_idx" | "token_pos"}.
One request per (dataset, problem_id) in first-appearance order, tokens in position order. A token needs exactly one
row for every layer: tokens lacking a layer (or logging one twice) are dropped and counted in extra["dropped_tokens"],
or rejected with incomplete="error".

The rows do not say the phase. The logs this format comes from are serving logs (vLLM, one router decision per
generated token), so every token is imported as decode unless phase="prefill" says the log is a forward pass over
a prompt; extra["phase"] records which and why. (Imported as prefill, a 2048-token prefill chunk folds a whole
problem into one call per layer and a replay sees only cold misses.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from freetoken.trace.format import DECODE, PREFILL, RoutingTrace, TraceError
from freetoken.trace.importers.rows import Row, check_picks, read_rows

INCOMPLETE = ("drop", "error")
PHASES = {"prefill": PREFILL, "decode": DECODE}
DEFAULT_PHASE = "decode"


def import_mixtral_jsonl(path: str | Path, *, incomplete: str = "drop", num_experts: int = 8,
                         num_layers: int | None = None, phase: str | None = None) -> RoutingTrace:
    # N = rows, U = distinct tokens, L = layers, K = top-k
    path = Path(path)
    if incomplete not in INCOMPLETE:
        raise ValueError(f"incomplete: unknown {incomplete!r}; valid: {', '.join(INCOMPLETE)}")
    if phase is not None and phase not in PHASES:
        raise ValueError(f"phase: unknown {phase!r}; valid: {', '.join(PHASES)}")
    problems: dict[tuple, int] = {}
    req, pos, layer, experts, gates, lines = [], [], [], [], [], []
    k = None
    for lineno, raw in read_rows(path):
        row = Row(path, lineno, raw)
        name = (raw.get("dataset", ""), row.key("problem_id"))
        req.append(problems.setdefault(name, len(problems)))
        if "token_idx" not in raw and "token_pos" not in raw:
            raise row.fail("token_idx", "is missing (nor is 'token_pos' there)")
        pos.append(row.int("token_idx" if "token_idx" in raw else "token_pos"))
        layer.append(row.int("layer"))
        if k is None:
            k = row.top_k("experts")
        experts.append(row.ints("experts", k))
        gates.append(row.floats("gating_probs", k))
        lines.append(lineno)
    if not lines:
        raise TraceError(f"{path}: no rows")
    req, pos, layer = (np.asarray(a, np.int64) for a in (req, pos, layer))  # [N]
    experts = np.asarray(experts, np.int64)  # [N, K]
    lines = np.asarray(lines, np.int64)
    check_picks(path, experts, lines, num_experts, "experts")
    L = int(layer.max()) + 1 if num_layers is None else num_layers
    if layer.max() >= L:
        i = int(np.argmax(layer))
        raise TraceError(f"{path}, line {lines[i]}: field 'layer' is {layer[i]}; the model has {L} layers")

    span = int(pos.max()) + 1
    uniq, inv = np.unique(req * span + pos, return_inverse=True)  # tokens sorted by (request, position)
    U = len(uniq)
    rows_per = np.bincount(inv * L + layer, minlength=U * L).reshape(U, L)  # [U, L]
    complete = (rows_per == 1).all(axis=1)  # [U]
    names = list(problems)
    if incomplete == "error" and not complete.all():
        u = int(np.flatnonzero(~complete)[0])
        missing = np.flatnonzero(rows_per[u] == 0).tolist()
        repeated = np.flatnonzero(rows_per[u] > 1).tolist()
        what = (f"lacks layers {missing}" if missing else "") + (" and " if missing and repeated else "") + \
               (f"logs layers {repeated} more than once" if repeated else "")
        raise TraceError(f"{path}: problem {_label(names[uniq[u] // span])} token {uniq[u] % span} {what} "
                         f"(incomplete='error'; use 'drop' to skip such tokens)")
    if not complete.any():
        raise TraceError(f"{path}: no token has exactly one row for each of the {L} layers")

    keep = complete[inv]  # [N] rows of complete tokens
    ex = np.zeros((U, L, k), np.int16)
    ex[inv[keep], layer[keep]] = experts[keep]
    g = np.zeros((U, L, k), np.float16)
    g[inv[keep], layer[keep]] = np.asarray(gates, np.float64)[keep]
    request = (uniq // span).astype(np.int32)
    dup_rows = int(np.clip(rows_per - 1, 0, None).sum())
    extra = {
        "dropped_tokens": str(int((~complete).sum())),
        "dropped_why": f"tokens without exactly one row for each of the {L} layers",
        "request_names": json.dumps([_label(n) for n in names]),
    }
    if dup_rows:
        extra["duplicate_rows"] = str(dup_rows)
    extra["phase"] = (f"{phase} (given)" if phase is not None else
                      f"{DEFAULT_PHASE} (the format's default: its rows do not say, and they come from serving logs, "
                      f"one router decision per generated token; import with --phase prefill for a forward pass over "
                      f"a prompt)")
    n = int(complete.sum())
    return RoutingTrace(ex[complete], num_experts, model="mixtral-8x7b", source=f"mixtral_jsonl:{path.name}",
                        request=request[complete], gates=g[complete], extra=extra,
                        phase=np.full(n, PHASES[phase or DEFAULT_PHASE], np.int8))


def _label(name: tuple) -> str:
    dataset, pid = name
    return f"{dataset}/{pid}" if dataset else str(pid)
