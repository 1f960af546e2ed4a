"""The result record of a prediction: throughputs and latencies summed from per-call times."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

import numpy as np

from freetoken.sim.cost import CallMeta, CallTimes
from freetoken.sim.overhead import copied_experts
from freetoken.sim.replay import ReplayLog

PREFILL, DECODE = 0, 1


@dataclass(slots=True)
class Prediction:
    model: str
    hardware: str
    engine: str
    policy: str
    split: str
    capacity_experts: int
    total_experts: int
    prompt_tokens: int  # prefill tokens of the whole trace
    decode_tokens: int
    prefill_s: float
    decode_s: float
    decode_tok_s: float
    prefill_tok_s: float
    ttft_s: float  # mean over turns with a prefill: that turn's prefill time
    ttft_worst_s: float
    turn_latency_p50_s: float  # prefill + decode of one (request, turn)
    turn_latency_worst_s: float
    miss_rate: float
    miss_rate_prefill: float
    miss_rate_decode: float
    fetched_gb: float
    cpu_gb: float
    lane_busy_s: dict[str, float] = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)
    band: dict = field(default_factory=dict)  # sim.band: {metric: [low, high]} under other routing localities
    decode_tok_s_turn_mean: float = 0.0  # per-request metric: the mean over turns of each turn's decode tok/s
    variants: dict = field(default_factory=dict)  # sim.batch: speculative / batched decode of the same setup

    def to_dict(self) -> dict:
        return asdict(self)


def _miss(log: ReplayLog, mask) -> float:
    hits, miss = log.hits[mask].sum(), log.fetched[mask].sum() + log.cpu[mask].sum()
    return float(miss / (hits + miss)) if hits + miss else 0.0


def _take(columns, mask: np.ndarray):
    """The same per-call record with only the calls where mask is true."""
    return type(columns)(**{f.name: None if getattr(columns, f.name) is None else getattr(columns, f.name)[mask]
                            for f in fields(columns)})


def summarize(log: ReplayLog, meta: CallMeta, times: CallTimes, expert_bytes: int,
              measured: np.ndarray | None = None, streamed: np.ndarray | None = None, **labels) -> Prediction:
    """measured: [N] calls to report (the rest warmed the cache). Replay and charge are causal, so dropping the
    warm-up's calls leaves the measured calls' times exactly as they ran after it. streamed: [N] the prefill double
    buffer's copies (sim.replay ReplayResult.streamed), which replace a streamed call's fetches on PCIe."""
    copied = copied_experts(log, streamed)
    if measured is not None:
        log, meta, times, copied = _take(log, measured), _take(meta, measured), _take(times, measured), copied[measured]
    pre, dec = log.phase == PREFILL, log.phase == DECODE
    first_layer = log.layer == 0  # one entry per chunk / token
    prompt = int(meta.tokens[pre & first_layer].sum())
    decoded = int(meta.tokens[dec & first_layer].sum())
    prefill_s, decode_s = float(times.seconds[pre].sum()), float(times.seconds[dec].sum())
    turn_key = log.request.astype(np.int64) * (int(meta.turn.max(initial=0)) + 1) + meta.turn
    turns, inv = np.unique(turn_key, return_inverse=True)
    per_turn = np.bincount(inv, weights=times.seconds, minlength=len(turns))
    ttft = np.bincount(inv[pre], weights=times.seconds[pre], minlength=len(turns))
    ttft = ttft[np.bincount(inv[pre], minlength=len(turns)) > 0]
    dec_s = np.bincount(inv[dec], weights=times.seconds[dec], minlength=len(turns))
    dec_n = np.bincount(inv[dec & first_layer], weights=meta.tokens[dec & first_layer], minlength=len(turns))
    turn_rates = dec_n[dec_s > 0] / dec_s[dec_s > 0]
    return Prediction(
        **labels,
        prompt_tokens=prompt, decode_tokens=decoded, prefill_s=prefill_s, decode_s=decode_s,
        decode_tok_s=decoded / decode_s if decode_s else 0.0,
        prefill_tok_s=prompt / prefill_s if prefill_s else 0.0,
        ttft_s=float(ttft.mean()) if len(ttft) else 0.0,
        ttft_worst_s=float(ttft.max()) if len(ttft) else 0.0,
        turn_latency_p50_s=float(np.median(per_turn)) if len(per_turn) else 0.0,
        turn_latency_worst_s=float(per_turn.max()) if len(per_turn) else 0.0,
        miss_rate=_miss(log, slice(None)), miss_rate_prefill=_miss(log, pre), miss_rate_decode=_miss(log, dec),
        fetched_gb=float((copied.sum() + log.prefetched.sum()) * expert_bytes / 1e9),
        cpu_gb=float(log.cpu.sum() * expert_bytes / 1e9),
        lane_busy_s={"gpu": float(times.gpu.sum()), "pcie": float(times.pcie.sum()), "cpu": float(times.cpu.sum())},
        decode_tok_s_turn_mean=float(turn_rates.mean()) if len(turn_rates) else 0.0,
    )
