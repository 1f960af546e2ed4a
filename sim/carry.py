"""The drafts' carry in a speculative replay: the rejected drafts' experts of one verify step, as the guess of what
the next verify step's calls need (the option carry="drafts" of lookahead / hinted_sweep).

A verify step routes every draft at every layer, the rejected ones too, so after step s an engine holds their
experts per layer. Step s + 1 verifies the corrected token and new drafts at the position the first rejected draft
guessed wrong, so the rejected drafts' routing is a guess of step s + 1's routing, layer by layer. The carry of a
verify step is the rejected rows of the decode step before it (prefill chunks between them do not break it), of the
sequences this step continues (batched: a finished sequence's drafts are not carried); the first step of a sequence
and every prefill call carry nothing. The policy reads the carry of the calls its hint reaches inside the sweep
(placement.carry.CarriedHint; compiled: sweep._upcoming): step s + 1's call of layer l is told the carry of its
calls of layers l + 1 .. l + depth, as the live engine can (it learns the rejected drafts after step s's last
layer; the engine's LiveCarry holds the same keys).
"""

from __future__ import annotations

import numpy as np

from freetoken.placement.call import DECODE, PREFILL
from freetoken.placement.callstream import call_stream
from freetoken.placement.stream import KeyStream
from freetoken.trace import RoutingTrace
from freetoken.sim.calls import Steps, steps_stream

REJECTED = 2  # a row's draft code (Steps.draft, a trace's draft field): a rejected draft


def carried_rows(trace: RoutingTrace, steps: Steps) -> list[np.ndarray]:
    """Per group of `steps`: the trace rows carried into it (the rejected drafts of the decode step before, of the
    sequences it continues; empty for prefill chunks and a sequence's first step)."""
    sequence = trace.request.astype(np.int64) << 32 | trace.turn.astype(np.int64)  # [T]
    none = np.zeros(0, np.int64)
    out: list[np.ndarray] = []
    rejected = none  # of the last decode step
    for g in range(len(steps.phase)):
        lo, hi = steps.offsets[g], steps.offsets[g + 1]
        if steps.phase[g] != DECODE:
            out.append(none)
            continue
        rows = steps.rows[lo:hi]
        out.append(rejected[np.isin(sequence[rejected], sequence[rows])])
        rejected = rows[steps.draft[lo:hi] == REJECTED]
    return out


def carry_stream(trace: RoutingTrace, steps: Steps) -> KeyStream:
    """Per call of steps_stream(trace, steps) (one per layer per group): the keys carried into it, the carried rows'
    experts of the call's layer merged as a call merges its tokens' (first use order)."""
    carried = carried_rows(trace, steps)
    L = trace.num_layers
    sizes = np.zeros((len(carried), L), np.int64)  # [G, L] keys per call
    full = [g for g, rows in enumerate(carried) if rows.size]
    if not full:
        return KeyStream(np.zeros(0, np.int64), np.zeros(len(carried) * L + 1, np.int64))
    rows = np.concatenate([carried[g] for g in full])  # [R] every carried row, group by group
    group = np.repeat(np.arange(len(full)), [carried[g].size for g in full])  # [R] one segment per group
    widest = max(carried[g].size for g in full)
    stream = call_stream(trace.experts[rows], trace.num_experts, np.zeros(rows.size, np.int64), group,
                         np.full(rows.size, PREFILL, np.int8), widest)  # one call per layer per carrying group
    sizes[full] = np.diff(stream.offsets).reshape(len(full), L)
    offsets = np.concatenate([[0], np.cumsum(sizes.reshape(-1))]).astype(np.int64)
    return KeyStream(stream.keys.astype(np.int64), offsets)


def recorded_steps(trace: RoutingTrace, prefill_chunk: int) -> Steps:
    """A recorded run's forwards (trace.stats.forward_spans: a drafted run's verify calls) as Steps, each row's draft
    code the trace's own."""
    from freetoken.trace.stats import forward_spans

    spans = forward_spans(trace, prefill_chunk)
    codes = trace.draft if trace.draft is not None else np.zeros(trace.num_tokens, np.int8)
    return Steps.of([np.arange(lo, hi) for lo, hi in spans], [int(trace.phase[lo]) for lo, _ in spans],
                    [int((codes[lo:hi] == 1).sum()) for lo, hi in spans], draft=[codes[lo:hi] for lo, hi in spans])


def carry_tally(trace: RoutingTrace, steps: Steps) -> tuple[int, int]:
    """(used, named): over the calls with a carry, their keys and those the carry named (the engine's DraftStats
    carry_used / carry_named of the same run)."""
    carry, stream = carry_stream(trace, steps), steps_stream(trace, steps)
    used = named = 0
    for c in np.flatnonzero(np.diff(carry.offsets)).tolist():
        keys = stream.keys[stream.offsets[c]:stream.offsets[c + 1]]
        used += keys.size
        named += int(np.isin(keys, carry.keys[carry.offsets[c]:carry.offsets[c + 1]]).sum())
    return used, named
