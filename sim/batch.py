"""Batched decode and speculative decoding / MTP: decode calls that carry several tokens.

Batched decode: N sequences decode in lockstep; step s runs each MoE layer once for the s-th decode token of every
sequence, so the call needs the union of their experts (an expert two sequences share is read once) with each
expert's token count. Reported per token (step time / N) and per sequence (steps / time).

Speculative decoding / MTP: a draft of depth d (the MTP head drafts d tokens, one layer pass each) and a verify
call of d + 1 tokens through the model. With each drafted token accepted with probability a, in order, until the
first rejection, a step yields E = 1 + a + ... + a^d = (1 - a^(d+1)) / (1 - a) tokens (the corrected or bonus
token included). The verify call routes d + 1 consecutive tokens of the trace (the tokens it checks; a rejected
draft routes like the token it guessed, which this approximates). The draft costs d passes of one layer, each
charged as one layer of a plain one-token decode step (Qwen3-Next / DeepSeek-V3 MTP: one transformer block).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from freetoken.placement import DECODE, PREFILL, make_call, make_policy
from freetoken.trace import RoutingTrace
from freetoken.sim.calls import segments
from freetoken.sim.cost import CallMeta, charge
from freetoken.sim.overhead import host_work
from freetoken.sim.replay import ReplayLog, replay


@dataclass(frozen=True, slots=True)
class Speculation:
    depth: int  # d: tokens drafted per step
    acceptance: float  # a: probability a drafted token is accepted (given the ones before it were)

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError(f"speculation depth must be >= 1, got {self.depth}")
        if not 0 <= self.acceptance <= 1:
            raise ValueError(f"acceptance rate must lie in [0, 1], got {self.acceptance}")

    @property
    def tokens_per_step(self) -> float:
        a, d = self.acceptance, self.depth
        return float(d + 1) if a == 1 else (1 - a ** (d + 1)) / (1 - a)


@dataclass(slots=True)
class Item:
    """One model pass: trace rows `rows` of requests `requests` (one per row)."""

    rows: np.ndarray
    phase: int


@dataclass(slots=True)
class DecodeResult:
    steps: int  # decode steps measured
    tokens: float  # tokens they produced (steps x sequences, or steps x E)
    seconds: float  # decode time, the draft's included
    sequences: int = 1

    @property
    def tok_s(self) -> float:
        """Aggregate decode tokens per second."""
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def per_sequence_tok_s(self) -> float:
        return self.tok_s / self.sequences

    @property
    def seconds_per_token(self) -> float:
        return self.seconds / self.tokens if self.tokens else 0.0


def _prefill_items(trace: RoutingTrace, start: int, end: int, chunk: int) -> list[Item]:
    return [Item(np.arange(lo, min(end, lo + chunk)), PREFILL) for lo in range(start, end, chunk)]


def speculative_items(trace: RoutingTrace, width: int, chunk: int) -> list[Item]:
    """Prefill in chunks; each decode segment in groups of `width` consecutive tokens (a verify call each)."""
    items = []
    for start, end in segments(trace):
        if trace.phase[start] == PREFILL:
            items += _prefill_items(trace, start, end, chunk)
        else:
            items += [Item(np.arange(lo, min(end, lo + width)), DECODE) for lo in range(start, end, width)]
    return items


def lockstep_items(trace: RoutingTrace, chunk: int) -> list[Item]:
    """Every request's prefill in turn, then decode in lockstep: step s holds each request's s-th decode token
    (requests that have finished drop out of later steps)."""
    items, decode_rows = [], {}
    for start, end in segments(trace):
        if trace.phase[start] == PREFILL:
            items += _prefill_items(trace, start, end, chunk)
        else:
            decode_rows.setdefault(int(trace.request[start]), []).extend(range(start, end))
    steps = max((len(r) for r in decode_rows.values()), default=0)
    for s in range(steps):
        items.append(Item(np.array([rows[s] for rows in decode_rows.values() if s < len(rows)]), DECODE))
    return items


def replay_items(setup, trace: RoutingTrace, items: list[Item]) -> tuple[ReplayLog, CallMeta]:
    """Each item as one call per MoE layer through the engine's policy and split; the log's per-lane token
    counts are (token, expert) pairs, as for prefill chunks."""
    from freetoken.trace.stats import expert_counts

    config, L = setup.config, trace.num_layers
    options = dict(config.options)
    if config.policy == "frequency" and "profile" not in options:
        options["profile"] = expert_counts(trace)
    policy = make_policy(config.policy, config.capacity, L, trace.num_experts, **options)
    calls, n, ctx, seqs = [], [], [], []
    seen: dict[int, int] = {}
    for item in items:
        requests = trace.request[item.rows]
        contexts = [seen.get(int(r), 0) for r in requests]
        for layer in range(L):
            calls.append(make_call(layer, trace.experts[item.rows, layer], item.phase, int(requests[0])))
        sequences = len(np.unique(requests))
        n.append(len(item.rows))
        ctx.append(float(np.mean(contexts)) if item.phase == DECODE else contexts[0])
        seqs.append(sequences)
        for r in requests:
            seen[int(r)] = seen.get(int(r), 0) + 1
    result = replay(calls, policy, config.split, expert_bytes=config.expert_bytes, keep_plans=True,
                    prefill_split=config.prefill_split)
    log = result.log
    for i, (call, plan) in enumerate(zip(calls, result.plans)):  # several decode tokens: pairs per lane
        if call.phase == DECODE and sum(call.tokens) > len(call.experts):
            per = dict(zip(call.experts, call.tokens))
            log.tokens[i] = sum(call.tokens)
            log.hit_tokens[i] = sum(per[e] for e in plan.hits)
            log.fetch_tokens[i] = sum(per[e] for e in plan.fetch)
            log.cpu_tokens[i] = sum(per[e] for e in plan.cpu)
    rep = lambda a, dtype: np.repeat(np.asarray(a, dtype), L)  # noqa: E731  one entry per layer
    meta = CallMeta(rep(n, np.int64), rep(np.round(ctx), np.int64), np.zeros(len(calls), np.int64),
                    rep(seqs, np.int64))
    return log, meta


def decode_seconds(setup, trace: RoutingTrace, items: list[Item], host: str = "shared",
                   measured_requests: np.ndarray | None = None) -> tuple[np.ndarray, ReplayLog, CallMeta]:
    """[N] seconds of every call, with the log and metadata; calls of requests not in measured_requests (the
    warm-up) are replayed and charged, then masked out by the caller."""
    log, meta = replay_items(setup, trace, items)
    card, hw, engine = setup.card, setup.hw, setup.engine
    from freetoken.sim.predict import layer_shape

    work = host_work(engine.host_work, log, card.num_layers, layer_shape(card), cuda_graphs=engine.cuda_graphs)
    return charge(log, meta, card, hw, engine.cost_options(host), work).seconds, log, meta


def batched_decode(setup, trace: RoutingTrace, host: str = "shared") -> DecodeResult:
    """trace: N requests (each its prompt, then its decode tokens), prefilled in turn, decoded in lockstep."""
    items = lockstep_items(trace, setup.engine.prefill_chunk)
    seconds, log, meta = decode_seconds(setup, trace, items, host)
    keep = log.phase == DECODE
    first = keep & (log.layer == 0)
    return DecodeResult(int(first.sum()), float(meta.tokens[first].sum()), float(seconds[keep].sum()),
                        int(len(np.unique(trace.request))))


def speculative_decode(setup, trace: RoutingTrace, spec: Speculation, plain_layer_s: float, host: str = "shared",
                       measured_from: int = 0) -> DecodeResult:
    """plain_layer_s: one MoE layer of a plain one-token decode step (the draft head's pass), e.g. a plain
    prediction's decode seconds per token / moe_layers."""
    items = speculative_items(trace, spec.depth + 1, setup.engine.prefill_chunk)
    seconds, log, meta = decode_seconds(setup, trace, items, host)
    keep = (log.phase == DECODE) & (log.request >= measured_from)
    steps = int((keep & (log.layer == 0)).sum())
    draft = steps * spec.depth * plain_layer_s
    return DecodeResult(steps, steps * spec.tokens_per_step, float(seconds[keep].sum()) + draft)


def predict_speculative(card, hw, engine, trace: RoutingTrace, spec: Speculation, plain_decode_tok_s: float,
                        warmup: RoutingTrace | None = None, host: str = "shared", **setup_kw) -> DecodeResult:
    """The request's decode as draft + verify steps after the warm-up; the draft's layer pass is one layer of the
    plain prediction's decode step (plain_decode_tok_s)."""
    from freetoken.sim.predict import join_after, prepare

    setup = prepare(card, hw, engine, **setup_kw)
    run = trace if warmup is None else join_after(warmup, trace)
    plain_layer_s = 1 / plain_decode_tok_s / setup.card.moe_layers
    return speculative_decode(setup, run, spec, plain_layer_s, host, measured_from=0 if warmup is None else 1)


def predict_batched(card, hw, engine, traces: list[RoutingTrace], host: str = "shared", **setup_kw) -> DecodeResult:
    """One request per trace (each its prompt then its decode), decoded together in lockstep."""
    from freetoken.sim.predict import prepare

    joined = RoutingTrace(np.concatenate([t.experts for t in traces]), traces[0].num_experts, model=traces[0].model,
                          source=traces[0].source,
                          request=np.concatenate([np.full(t.num_tokens, i, np.int32) for i, t in enumerate(traces)]),
                          phase=np.concatenate([t.phase for t in traces]))
    return batched_decode(prepare(card, hw, engine, **setup_kw), joined, host)
