"""Replay a routing trace through a placement policy and a miss split: the simulator's executor.

The executor only counts what each Plan says; charging time for it is the cost model's job. Per-call
counts are kept as columns (ReplayLog) so the cost model and per-request / per-phase breakdowns read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import add
from typing import Callable, Iterable

import numpy as np

from freetoken.placement import DECODE, PREFILL, Call, CallStream, CompiledPolicy, PlacementPolicy, Plan, Split
from freetoken.placement.counts import Counts, count, count_by

PHASE_NAMES = {PREFILL: "prefill", DECODE: "decode"}
COLUMNS = ("layer", "phase", "request", "experts", "tokens", "hits", "fetched", "cpu", "evictions", "prefetched",
           "hit_tokens", "fetch_tokens", "cpu_tokens")


@dataclass(slots=True)
class ReplayLog:
    """One entry per MoE-layer call; *_tokens count (token, expert) pairs each lane computes."""

    layer: np.ndarray
    phase: np.ndarray
    request: np.ndarray
    experts: np.ndarray  # distinct experts the call needs
    tokens: np.ndarray  # (token, expert) pairs of the call
    hits: np.ndarray
    fetched: np.ndarray
    cpu: np.ndarray
    evictions: np.ndarray
    prefetched: np.ndarray
    hit_tokens: np.ndarray
    fetch_tokens: np.ndarray
    cpu_tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.layer)


@dataclass(slots=True)
class ReplayResult:
    policy: str
    split: str
    capacity: int
    log: ReplayLog
    expert_bytes: int = 0
    plans: list[Plan] | None = None
    summed: Counts | None = None  # the totals as a compiled replay summed them while it ran (= count(log))
    streamed: np.ndarray | None = None  # [N] the prefill double buffer's copies per call (replay_stream double_buffer)

    @property
    def total(self) -> Counts:
        if self.summed is not None:
            return self.summed.copy()  # a fresh record, as count() gives
        return count(self.log, None, self.expert_bytes)

    def by_phase(self) -> dict[str, Counts]:
        return {PHASE_NAMES[p]: c for p, c in count_by(self.log, self.log.phase, self.expert_bytes).items()}

    def by_request(self) -> dict[int, Counts]:
        return count_by(self.log, self.log.request, self.expert_bytes)

    def to_dict(self, breakdown: bool = True) -> dict:
        out = {"policy": self.policy, "split": self.split, "capacity": self.capacity, **self.total.to_dict()}
        if breakdown:
            out["phases"] = {k: v.to_dict() for k, v in self.by_phase().items()}
            out["requests"] = {str(k): v.to_dict() for k, v in self.by_request().items()}
        return out


PROGRESS_STEPS = 100  # a compiled replay returns to Python this many times, to draw progress


def replay_stream(stream: CallStream, policy: PlacementPolicy, split: Split, *, expert_bytes: int = 0,
                  keep_plans: bool = False, on_call: Callable[..., None] | None = None,
                  prefill_split: Split | None = None, double_buffer: bool = False) -> ReplayResult:
    """Replay a CallStream. A compiled policy runs it in compiled code, filling the log's columns in place (a few
    returns to Python for progress); any other policy (or keep_plans) goes call by call through policy.plan.
    prefill_split: the split prefill calls use (None: `split`, as decode's); the compiled replay then runs each
    phase's run of calls with its own. double_buffer: also record what freetoken's prefill double buffer streams
    into each call (ReplayResult.streamed, see streams_prefill); the compiled replay then runs those calls one by
    one, reading the residency before each."""
    if keep_plans or not isinstance(policy, CompiledPolicy):
        return replay(stream.calls(), policy, split, expert_bytes=expert_bytes, keep_plans=keep_plans,
                      on_call=on_call, prefill_split=prefill_split, double_buffer=double_buffer)
    C = stream.num_calls
    if stream.num_experts != policy.num_experts or (C and stream.num_layers > policy.num_layers):
        raise ValueError(f"the calls need {stream.num_layers if C else 0} layers x {stream.num_experts} experts; "
                         f"the policy has {policy.num_layers} x {policy.num_experts}")
    # hits .. cpu_tokens, then experts and tokens: every call's column written by the compiled loop (the last
    # two by a stream replay only)
    counts = np.empty((10, C), np.int64)
    streamed = _no_streams(C) if double_buffer else None
    if C and on_call is None and not double_buffer and (prefill_split is None or prefill_split == split):
        sums = policy.replay(stream, split, 0, C, counts)  # one run of every call (the plain replay, ~1 us less)
    else:
        sums = _chunks(stream, policy, split, counts, on_call, prefill_split, streamed)
    summed = None
    if sums is not None and C:
        hits, cpu, evictions, cpu_tokens = sums
        fetched = stream.num_accesses - hits - cpu
        summed = Counts(C, hits, fetched, cpu, evictions, 0, cpu_tokens, fetched * expert_bytes)
    else:  # [C] distinct experts, and (token, expert) pairs (each is hit, fetched or cpu)
        np.subtract(stream.offsets[1:], stream.offsets[:-1], out=counts[8])
        np.add(counts[5], counts[6], out=counts[9])
        np.add(counts[9], counts[7], out=counts[9])
    # layer, phase, request: the stream's own columns (phase stays int8: its readers compare it, ~2 us saved)
    rows = tuple(counts)  # [10] row views, in one call
    log = ReplayLog(stream.layer, stream.phase, stream.request, rows[8], rows[9], *rows[:8])
    return ReplayResult(policy.name, split_label(split, prefill_split), policy.capacity, log, expert_bytes,
                        summed=summed, streamed=streamed)


def _chunks(stream: CallStream, policy, split: Split, counts: np.ndarray, on_call, prefill_split, streamed):
    """replay_stream's compiled replay in chunks (progress) and phase runs (prefill's own split, the double
    buffer's one-by-one prefill calls); returns the summed (hits, cpu, evictions, cpu_tokens), or None when a chunk
    returned none."""
    C = stream.num_calls
    step = max(1, -(-C // PROGRESS_STEPS)) if on_call is not None else max(C, 1)
    sums = (0, 0, 0, 0)  # hits, cpu, evictions, cpu_tokens, while every chunk returns them
    one_by_one = streamed is not None and streams_prefill(policy, split, prefill_split)
    for c0 in range(0, C, step):
        c1 = min(C, c0 + step)
        for lo, hi, phase_split in _phase_runs(stream.phase, c0, c1, split, prefill_split, one_by_one):
            if one_by_one and stream.phase[lo] == PREFILL and stream.layer[lo] >= 1:  # a run of this one call
                streamed[lo] = missing(policy, int(stream.layer[lo]))
            got = policy.replay(stream, phase_split, lo, hi, counts)
            sums = None if got is None or sums is None else tuple(map(add, sums, got))
        if on_call is not None:
            on_call(c1 - c0)
    return sums


def streams_prefill(policy: PlacementPolicy, split: Split, prefill_split: Split | None = None) -> bool:
    """Whether freetoken's prefill double buffer (engine/cache.py _stream_next) streams: prefill's split (prefill_split,
    else split) is offload and its fetches are not admitted, so only a prefetch can change residency between layer
    l - 1's call and layer l's. It then streams into each prefill call of MoE layer l >= 1 every expert of layer l
    not resident once layer l - 1's call was planned (`missing`, read before layer l's call is planned)."""
    prefill = split if prefill_split is None else prefill_split
    return prefill.mode == "offload" and not (policy.admits and prefill.admit_prefill)


def missing(policy: PlacementPolicy, layer: int) -> int:
    """How many experts of `layer` hold no slot: what the prefill double buffer streams into the layer's call."""
    return sum(policy.slot(layer, e) < 0 for e in range(policy.num_experts))


def _no_streams(n: int) -> np.ndarray:
    return np.full(n, -1, np.int64)  # [N] -1: the call copies its own fetches


def split_label(split: Split, prefill_split: Split | None = None) -> str:
    """The split as results name it (hybrid-<rule>), with prefill's own when it differs from decode's."""
    def name(sp: Split) -> str:
        return sp.mode if sp.mode != "hybrid" else f"hybrid-{sp.rule}"
    if prefill_split is None or prefill_split == split:
        return name(split)
    return f"{name(split)} (prefill {name(prefill_split)})"


def _phase_runs(phase: np.ndarray, c0: int, c1: int, split: Split, prefill_split: Split | None,
                prefill_one_by_one: bool = False):
    """(lo, hi, split) over calls c0..c1-1: one run with `split` when prefill has no split of its own, else each
    run of same-phase calls with its phase's split. prefill_one_by_one: each prefill call a run of its own."""
    if (prefill_split is None or prefill_split == split) and not prefill_one_by_one:
        return [(c0, c1, split)]
    prefill = split if prefill_split is None else prefill_split
    cuts = c0 + 1 + np.flatnonzero(phase[c0 + 1:c1] != phase[c0:c1 - 1])  # first call of each new run
    bounds = [c0, *cuts.tolist(), c1]
    runs = [(lo, hi, prefill if phase[lo] == PREFILL else split) for lo, hi in zip(bounds, bounds[1:])]
    if prefill_one_by_one:
        runs = [one for lo, hi, sp in runs
                for one in ([(i, i + 1, sp) for i in range(lo, hi)] if phase[lo] == PREFILL else [(lo, hi, sp)])]
    return runs


def replay(calls: Iterable[Call], policy: PlacementPolicy, split: Split, *, expert_bytes: int = 0,
           keep_plans: bool = False, on_call: Callable[..., None] | None = None,
           prefill_split: Split | None = None, double_buffer: bool = False) -> ReplayResult:
    """Run every call through policy.plan and log what the plan moves. on_call: progress hook, once per call.
    prefill_split: the split prefill calls use (None: `split`). double_buffer: as replay_stream's."""
    rows: list[tuple[int, ...]] = []  # one row of COLUMNS per call (a single append on the hot path)
    row = rows.append
    plans: list[Plan] | None = [] if keep_plans else None
    plan_fn = policy.plan
    by_phase = (split, split) if prefill_split is None else (prefill_split, split)  # indexed by call.phase
    streams = {} if double_buffer and streams_prefill(policy, split, prefill_split) else None  # call index -> copies
    for call in calls:
        if streams is not None and call.phase == PREFILL and call.layer >= 1:
            streams[len(rows)] = missing(policy, call.layer)
        plan = plan_fn(call, by_phase[call.phase])
        n = len(call.experts)
        h, f, c = len(plan.hits), len(plan.fetch), len(plan.cpu)
        tok = sum(call.tokens)
        if tok == n:  # every expert used by one token (a plain decode step): one (token, expert) pair each
            ht, ft, ct = h, f, c
        else:  # a prefill chunk, a batch's or a verify step's call
            per = dict(zip(call.experts, call.tokens)).__getitem__
            ht = sum(map(per, plan.hits)) if h else 0
            ft = sum(map(per, plan.fetch)) if f else 0
            ct = sum(map(per, plan.cpu)) if c else 0
        row((call.layer, call.phase, call.request, n, tok, h, f, c, len(plan.evict), len(plan.prefetch), ht, ft, ct))
        if plans is not None:
            plans.append(plan)
        if on_call is not None:
            on_call()
    table = np.array(rows, np.int64).reshape(len(rows), len(COLUMNS)).T.copy()  # [columns, calls]
    log = ReplayLog(**dict(zip(COLUMNS, table)))
    streamed = _no_streams(len(rows)) if double_buffer else None
    if streams:
        streamed[list(streams)] = list(streams.values())
    return ReplayResult(policy.name, split_label(split, prefill_split), policy.capacity, log, expert_bytes, plans,
                        streamed=streamed)
