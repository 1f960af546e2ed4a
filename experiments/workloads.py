"""Workloads for the cost model: multi-turn conversations routed like a model's shape, with or without KV reuse.

A conversation is `turns` turns of (prompt_tokens new prompt, decode_tokens reply). With cache anchors the server
keeps the conversation's KV cache, so turn t prefills only its new prompt; without, turn t re-prefills the whole
history (earlier prompts and replies) before its new prompt. Re-prefilled tokens route as they did the first time
(causal attention: a token's routing depends only on the tokens before it).
"""

from __future__ import annotations

import numpy as np

from freetoken.trace import DECODE, PREFILL, RoutingTrace


def conversation_routes(card, spec, conversation: int) -> np.ndarray:
    """[turns * (prompt + decode), L, K] expert picks of one conversation (sim.predict's synthetic routing)."""
    from freetoken.sim.predict import synthetic_trace

    total = spec.turns * (spec.prompt_tokens + spec.decode_tokens)
    return synthetic_trace(card, total, 0, seed=spec.seed + conversation).experts


def conversation_trace(card, spec, turns: int | None = None, conversations: range | None = None) -> RoutingTrace:
    """The first `turns` turns of the given conversations (default: all), as the server would run them."""
    turns = spec.turns if turns is None else turns
    conversations = range(spec.conversations) if conversations is None else conversations
    P, D = spec.prompt_tokens, spec.decode_tokens
    parts = []  # (experts [n, L, K], request, turn, phase)
    for c in conversations:
        routes = conversation_routes(card, spec, c)
        for t in range(turns):
            start = t * (P + D)
            if spec.anchors:  # KV kept: only this turn's prompt is new
                prefill, request = routes[start:start + P], c
            else:  # no reuse: a fresh request re-reads the whole history, then the new prompt
                prefill, request = routes[:start + P], c * spec.turns + t
            decode = routes[start + P:start + P + D]
            parts.append((prefill, request, t, PREFILL))
            parts.append((decode, request, t, DECODE))
    parts = [p for p in parts if len(p[0])]
    experts = np.concatenate([p[0] for p in parts])
    col = lambda i, dtype: np.concatenate([np.full(len(p[0]), p[i], dtype) for p in parts])  # noqa: E731
    return RoutingTrace(np.ascontiguousarray(experts), card.num_experts, model=f"conversation:{card.name}",
                        source="synthetic", request=col(1, np.int32), turn=col(2, np.int32),
                        phase=col(3, np.int8), extra={"anchors": str(spec.anchors).lower()})
