"""Speculative decoding in the replay: each decode step is one verify call that carries d + 1 tokens' experts.

A step at decode position t verifies the true token t and a draft of d tokens (Speculation: depth d, acceptance
a). Draft j is the true token t + j with probability a while every draft before it was, else another token of the
same sequence (a uniformly drawn other decode row, earlier or later alike: a sample of the sequence's routing,
not a forecast); a draft past the sequence's last token is always another token. The k leading true drafts are
accepted and the next step starts at t + k + 1 (the corrected or bonus token). Every draft's routing is in the
verify call, the rejected ones' too: that is what a real verify pass computes. Prefill is cut into chunks as in a
plain replay. The draws are seeded (one generator per replay): k of a fixed seed is reproducible.

The calls are built by the one call builder (sim.calls.steps_stream): every chunk or verify step one call per
layer, so hint-taking policies (lookahead, hinted_sweep) see the verify calls' routing, the drafts' included,
in their oracle's future: the router hint names the next layers' experts of all d + 1 tokens. The router hint stops
at the step boundary: the next step's tokens exist only once this step's last layer has been sampled. The option
carry="drafts" (sim/carry.py) adds a guess of the next step's routing: each step's rejected drafts (Steps.draft 2)
were routed at every layer. An engine learns which drafts it rejected only once the last layer's output is sampled,
so the carry crosses no sweep's end: step s + 1's call of layer l is told step s's rejected drafts' experts of the
layers its hint reaches (l + 1 .. l + depth, inside the sweep), as the engine does live (placement.carry).
"""

from __future__ import annotations

import numpy as np

from freetoken.placement.call import DECODE, PREFILL
from freetoken.trace import RoutingTrace
from freetoken.sim.batch import Speculation
from freetoken.sim.calls import Steps, segments


def verify_step(t: int, lo: int, hi: int, spec: Speculation, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """One verify step at decode row t of the sequence's rows [lo, hi): (its rows: t, then the d drafts; the drafts
    it accepted). The next step starts at t + accepted + 1."""
    n, d, a = hi - lo, spec.depth, spec.acceptance
    u = rng.random(d)  # [d] acceptance draws
    other = rng.integers(0, max(n - 1, 1), size=d)  # [d] index among the sequence's other rows
    rows, k, chain = [t], 0, True
    for j in range(1, d + 1):
        true = t + j
        if chain and true < hi and u[j - 1] < a:
            rows.append(true)
            k += 1
            continue
        chain = False
        if n == 1:  # a one-token sequence has no other token: the draft repeats it
            rows.append(lo)
            continue
        skip = (true if true < hi else t) - lo  # the true token (past the end: the current one) is no draw
        i = int(other[j - 1])
        rows.append(lo + i + (i >= skip))
    return np.asarray(rows, np.int64), k


def draft_codes(accepted: int, depth: int) -> np.ndarray:
    """[depth + 1] the rows of a verify step as a trace's draft field: the true token 0, the accepted drafts 1, the
    rejected ones 2."""
    return np.r_[0, np.ones(accepted), np.full(depth - accepted, 2)].astype(np.int8)


def draft_rows(lo: int, hi: int, spec: Speculation, rng: np.random.Generator) -> tuple[list[np.ndarray], list[int]]:
    """Verify steps of the decode rows [lo, hi) of one sequence: (rows of each step, drafts each accepted)."""
    steps, accepted, t = [], [], lo
    while t < hi:
        rows, k = verify_step(t, lo, hi, spec, rng)
        steps.append(rows)
        accepted.append(k)
        t += k + 1
    return steps, accepted


def speculative_steps(trace: RoutingTrace, spec: Speculation, prefill_chunk: int, seed: int = 0) -> Steps:
    """Prefill segments in chunks of prefill_chunk, decode segments as verify steps (draft_rows)."""
    if prefill_chunk <= 0:
        raise ValueError(f"prefill_chunk must be positive, got {prefill_chunk}")
    rng = np.random.default_rng(seed)
    groups: list[np.ndarray] = []
    phase: list[int] = []
    accepted: list[int] = []
    draft: list[np.ndarray] = []
    for lo, hi in segments(trace):
        if trace.phase[lo] == PREFILL:
            for s in range(lo, hi, prefill_chunk):
                groups.append(np.arange(s, min(hi, s + prefill_chunk)))
                phase.append(PREFILL)
                accepted.append(0)
                draft.append(np.zeros(len(groups[-1]), np.int8))
        else:
            steps, acc = draft_rows(lo, hi, spec, rng)
            groups += steps
            phase += [DECODE] * len(steps)
            accepted += acc
            draft += [draft_codes(k, spec.depth) for k in acc]
    return Steps.of(groups, phase, accepted, draft=draft)
