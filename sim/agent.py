"""Agent workloads: turn-structured synthetic requests whose turns differ, served with cache anchors (KV reuse).

A workload is a list of turns (new prompt tokens, decode tokens). With cache anchors the server keeps the
request's KV cache, so turn t prefills only its new tokens at the context of every turn before it, and TTFT,
the mean turn and the worst turn differ. Reported as the paper's metrics: per-request mean decode tok/s (the
mean over turns of each turn's decode tok/s), mean TTFT over turns, and the worst turn's latency.

Shapes (estimates of typical sessions, not measured traces):
    decode-heavy     one turn: a short prompt, a long answer
    coding-session   ~60K tokens: a 12K-token first turn (system prompt, repository context), then nine turns of
                     ~4.5K new tokens (tool output, file contents, the user's next ask) and 800-token replies
    tool-use         13 turns: a 6K-token first turn (system prompt, tool schemas), then twelve 700-token tool
                     results; every turn answers with a 150-token tool call or reply
"""

from __future__ import annotations

import numpy as np

from freetoken.trace import DECODE, PREFILL, RoutingTrace

AGENT_WORKLOADS: dict[str, list[tuple[int, int]]] = {
    "decode-heavy": [(512, 2048)],
    "coding-session": [(12000, 800)] + [(4500, 800)] * 9,
    "tool-use": [(6000, 150)] + [(700, 150)] * 12,
}
WORKLOADS = ("single", *AGENT_WORKLOADS)  # ft predict --workload: one prompt and answer, or an agent session


def workload_turns(name: str) -> list[tuple[int, int]]:
    try:
        return AGENT_WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; valid: {', '.join(AGENT_WORKLOADS)}") from None


def agent_trace(card, turns: list[tuple[int, int]], warmup_decode: int = 0, **routing) -> RoutingTrace:
    """One request of the given turns (one synthetic routing stream, so turns share the request's hot experts),
    then `warmup_decode` more decode steps of the same routing as the last turn (sim.predict.warmup_split)."""
    from freetoken.sim.predict import synthetic_trace

    if not turns or any(p < 0 or d < 0 or p + d == 0 for p, d in turns):
        raise ValueError(f"turns must be (prompt, decode) pairs of token counts >= 0, not both 0: {turns}")
    total = sum(p + d for p, d in turns) + warmup_decode
    experts = synthetic_trace(card, total, 0, **routing).experts
    phase = np.concatenate([np.r_[np.full(p, PREFILL), np.full(d, DECODE)] for p, d in turns]
                           + [np.full(warmup_decode, DECODE)]).astype(np.int8)
    turn = np.concatenate([np.full(p + d, t) for t, (p, d) in enumerate(turns)]
                          + [np.full(warmup_decode, len(turns) - 1)]).astype(np.int32)
    return RoutingTrace(np.ascontiguousarray(experts), card.num_experts, model=f"agent:{card.name}",
                        source="synthetic", request=np.zeros(total, np.int32), turn=turn, phase=phase)
