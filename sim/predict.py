"""One prediction: model card + hardware profile + engine (+ a trace, or a synthetic one of the model's shape)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from freetoken.quant import describe
from freetoken.trace import DECODE, PREFILL, RoutingTrace, load, save
from freetoken.sim.cost import call_meta, charge
from freetoken.sim.engines import Engine, get_engine
from freetoken.sim.hardware import HardwareProfile
from freetoken.sim.model_card import ModelCard
from freetoken.sim.overhead import LayerShape, host_work
from freetoken.sim.planner import DEFAULT_KV_FLOOR, plan_for, policy_capacity
from freetoken.sim.prediction import Prediction, summarize
from freetoken.sim.replay import ReplayResult
from freetoken.sim.run import SimConfig, simulate

# Synthetic routing knobs: what sim.synth.fit_spec finds for the recorded DeepSeek-V2-Lite trace (fine-grained
# experts with a shared expert, as the Qwen3.5 / DeepSeek families; the same values as the shipped 48x128 trace,
# traces/README.md): mean Zipf exponent 0.25, reuse 0.8 within 16 tokens. A trace of the model replaces them.
SYNTH_SKEW, SYNTH_REUSE, SYNTH_WINDOW = 0.25, 0.8, 16
SYNTH_PIECE = 512  # tokens generated per synthetic request; pieces are joined into one request
DEFAULT_PROMPT, DEFAULT_DECODE = 4096, 256


def synthetic_trace(card: ModelCard, prompt_tokens: int, decode_tokens: int, *, skew: float = SYNTH_SKEW,
                    reuse: float = SYNTH_REUSE, window: int = SYNTH_WINDOW, seed: int = 0,
                    cache_dir: Path | None = None) -> RoutingTrace:
    """One request: a prompt then decode steps, routed like the model's shape (L x E, top-k).

    sim.synth generates in parallel over requests, so the request is drawn as pieces of SYNTH_PIECE tokens of one
    spec (same per-layer popularity) and joined; reuse restarts at each piece's start. Cached on disk by spec.
    """
    from freetoken.sim.synth import SynthSpec, synthesize

    if prompt_tokens < 0 or decode_tokens < 0 or prompt_tokens + decode_tokens == 0:
        raise ValueError(f"prompt and decode tokens must be >= 0 and not both 0, got {prompt_tokens}, {decode_tokens}")
    total = prompt_tokens + decode_tokens
    pieces = -(-total // SYNTH_PIECE)
    spec = SynthSpec(card.moe_layers, card.num_experts, card.top_k, pieces * SYNTH_PIECE, num_requests=pieces,
                     prefill_share=1.0, skew=skew, reuse=reuse, window=window, seed=seed, model=f"synthetic:{card.name}")
    key = hashlib.sha1(json.dumps([repr(spec), prompt_tokens, decode_tokens]).encode()).hexdigest()[:16]
    cache = (cache_dir or _cache_dir()) / f"{card.name}-{key}.safetensors"
    if cache.is_file():
        return load(cache)
    raw = synthesize(spec)
    phase = np.where(np.arange(total) < prompt_tokens, PREFILL, DECODE).astype(np.int8)
    trace = RoutingTrace(np.ascontiguousarray(raw.experts[:total]), card.num_experts, model=spec.model,
                         source="synthetic", request=np.zeros(total, np.int32), phase=phase,
                         extra={"synth_spec": raw.extra["synth_spec"], "synth_piece": str(SYNTH_PIECE)})
    try:
        save(trace, cache)
    except OSError:  # a read-only cache is no reason to fail a prediction
        pass
    return trace


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "freetoken" / "synth"


def check_shape(trace: RoutingTrace, card: ModelCard, where: str = "trace") -> None:
    shape = (trace.num_layers, trace.num_experts, trace.top_k)
    want = (card.moe_layers, card.num_experts, card.top_k)
    if shape != want:
        raise ValueError(f"{where} routes {shape[0]} MoE layers x {shape[1]} experts, top-{shape[2]}; model "
                         f"{card.name} has {want[0]} x {want[1]}, top-{want[2]}: use a trace of this model, or "
                         f"omit --trace for a synthetic one")


def warmup_split(trace: RoutingTrace, decode_tokens: int) -> tuple[RoutingTrace, RoutingTrace]:
    """(measured, warm-up): the trace's last `decode_tokens` decode steps become the warm-up, the rest is measured."""
    decode = np.flatnonzero(trace.phase == DECODE)
    if decode_tokens <= 0 or decode_tokens >= len(decode):
        raise ValueError(f"warm-up decode tokens must lie in [1, {len(decode) - 1}] for this trace "
                         f"({len(decode)} decode steps), got {decode_tokens}")
    warm = decode[-decode_tokens:]
    keep = np.ones(trace.num_tokens, bool)
    keep[warm] = False
    return trace.select(keep), trace.select(np.isin(np.arange(trace.num_tokens), warm))


def join_after(warm: RoutingTrace, trace: RoutingTrace) -> RoutingTrace:
    """warm's tokens as request 0, then trace's requests shifted past it."""
    gates = None if warm.gates is None or trace.gates is None else np.concatenate([warm.gates, trace.gates])
    return RoutingTrace(np.concatenate([warm.experts, trace.experts]), trace.num_experts, model=trace.model,
                        source=trace.source, gates=gates, extra=dict(trace.extra),
                        request=np.concatenate([np.zeros(warm.num_tokens, np.int32), trace.request + 1]),
                        turn=np.concatenate([warm.turn, trace.turn]), phase=np.concatenate([warm.phase, trace.phase]),
                        token=np.concatenate([warm.token, trace.token]))


@dataclass(frozen=True, slots=True)
class Setup:
    """What a prediction replays and charges with: the card in the engine's formats, the hardware under the
    engine's CPU settings, the engine, and the replay's policy / split / capacity."""

    card: ModelCard
    hw: HardwareProfile
    engine: Engine
    engine_name: str
    config: SimConfig


def prepare(card: ModelCard, hw: HardwareProfile, engine_name: str | Engine, *, min_context: int = DEFAULT_KV_FLOOR,
            n_cpu_layers: int | None = None, capacity: int | None = None) -> Setup:
    """capacity: the policy's expert slots instead of the memory planner's (must not exceed the model's experts;
    the planner's, for engines with staging, are its slots less one layer, two with the double buffer, as freetoken's
    slot pool splits them)."""
    engine = get_engine(engine_name) if isinstance(engine_name, str) else engine_name
    engine_name = engine_name if isinstance(engine_name, str) else "custom"
    card = card.with_quant(engine.expert_quant, engine.dense_quant, engine.compute_dtype).with_kv(engine.kv_dtype)
    hw = engine.hardware_for(hw)
    layers = engine.staging_layers() if engine.staging else 1
    plan = plan_for(card, hw, min_context, layers)
    if capacity is not None and not 0 <= capacity <= card.num_keys:
        raise ValueError(f"capacity {capacity} must lie in [0, {card.num_keys}]: {card.name} has {card.moe_layers} "
                         f"MoE layers x {card.num_experts} experts")
    if capacity is None:
        capacity = policy_capacity(plan, card, layers) if engine.staging else plan.expert_slots
    if engine.resident and capacity < card.num_keys:
        raise ValueError(f"engine {engine_name}: all {card.num_keys} experts of {card.name} need "
                         f"{card.all_expert_bytes() / 2**30:.1f} GiB; {hw.name} leaves room for {capacity} "
                         f"({plan.expert_bytes / 2**30:.1f} GiB) after dense weights and a {min_context}-token KV floor")
    options = dict(engine.policy_options)
    policy = engine.policy
    if capacity >= card.num_keys and policy != "static_layers":  # everything fits: loaded at start-up, no cold misses
        policy, options = "static_layers", {"n_cpu_layers": 0}
    if options.get("n_cpu_layers") == "all":
        options["n_cpu_layers"] = card.moe_layers
    if n_cpu_layers is not None:
        if engine.policy != "static_layers":
            raise ValueError(f"--n-cpu-moe applies to static-layer engines (llamacpp-*), not {engine_name}")
        options["n_cpu_layers"] = n_cpu_layers
    config = SimConfig(policy, engine.split_for(card, hw), capacity=capacity, prefill_chunk=engine.prefill_chunk,
                       expert_bytes=card.expert_bytes(), options=options, prefill_split=engine.prefill_split_for())
    return Setup(card, hw, engine, engine_name, config)


def predict(card: ModelCard, hw: HardwareProfile, engine_name: str | Engine, trace: RoutingTrace, *,
            min_context: int = DEFAULT_KV_FLOOR, host: str = "shared", n_cpu_layers: int | None = None,
            capacity: int | None = None, on_call=None, warmup: RoutingTrace | None = None) -> Prediction:
    """warmup: routing replayed first and not reported, so `trace` meets the cache a running server would have."""
    check_shape(trace, card)
    setup = prepare(card, hw, engine_name, min_context=min_context, n_cpu_layers=n_cpu_layers, capacity=capacity)
    card, hw, engine, engine_name, config = setup.card, setup.hw, setup.engine, setup.engine_name, setup.config
    capacity, options = config.capacity, config.options
    run = trace if warmup is None else join_after(warmup, trace)
    if warmup is not None:
        check_shape(warmup, card, "warm-up trace")
    result = engine_replay(engine, run, config, on_call)
    meta = call_meta(run, engine.prefill_chunk)
    streamed = result.streamed
    work = host_work(engine.host_work, result.log, card.num_layers, layer_shape(card), cuda_graphs=engine.cuda_graphs,
                     streamed=streamed)
    times = charge(result.log, meta, card, hw, engine.cost_options(host), work, streamed=streamed)
    measured = None if warmup is None else result.log.request > 0
    pred = summarize(result.log, meta, times, card.expert_bytes(), measured, streamed, model=card.name, hardware=hw.name,
                     engine=engine_name, policy=result.policy, split=result.split, capacity_experts=capacity,
                     total_experts=card.num_keys)
    pred.inputs = {"expert_bytes": card.expert_bytes(), "expert_bits": card.expert_bits,
                   "expert_format": describe(card.expert_format) if card.expert_format else None,
                   "dense_bits": card.dense_bits, "bp_gb_s": hw.pcie_gb_s, "bh_gb_s": hw.host_gb_s,
                   "dram_gb_s": hw.dram_gb_s, "hbm_gb_s": hw.hbm_gb_s, "host": host,
                   "prefill_chunk": engine.prefill_chunk, "min_context": min_context,
                   "kv_dtype": engine.kv_dtype, "kv_bytes_per_token": card.kv_bytes_per_token,
                   "n_cpu_layers": options.get("n_cpu_layers"), "trace": trace.model,
                   "engine_settings": engine.settings(), "launch_us": hw.launch_us, "sync_us": hw.sync_us,
                   "dispatch_us": engine.dispatch_us, "gemm_efficiency": hw.gemm_efficiency,
                   "gemv_efficiency": hw.gemv_efficiency,
                   "moe_gemm_efficiency": hw.moe_gemm_efficiency or hw.gemm_efficiency,
                   "attention_efficiency": hw.attention_efficiency or hw.gemm_efficiency,
                   "host_work_per_decode_token": _per_token(work, result.log, measured),
                   "host_work_prefill": _prefill_totals(work, result.log, measured)}
    return pred


def engine_replay(engine: Engine, run: RoutingTrace, config: SimConfig, on_call=None) -> ReplayResult:
    """The replay of `run` (sim.run.simulate's), recording in the same pass what freetoken's prefill double buffer
    streams into each call (result.streamed, sim.replay.streams_prefill) when the engine has it on; None otherwise
    (each call copies its own fetches)."""
    return simulate(run, config, on_call=on_call,
                    double_buffer=engine.double_buffer and engine.host_work == "freetoken")


def layer_shape(card: ModelCard) -> LayerShape:
    """A card's layer as freetoken runs it: q/k norms (Qwen3 families), a gated shared expert when it has one; a
    hybrid card (linear-attention state, fewer attention than decoder layers) as Qwen3-Next / Qwen3.5 lay it out:
    full attention, with an output gate, in every (num_layers / attention_layers)-th layer, Gated DeltaNet in the
    others (taken over the MoE layer indices). The Triton kernel set's fusions (engine/model.py): residual adds
    inside the norms always; the q / k prologue and a decode token's norm + qkv projection where attention has no
    output gate and a 16-bit cache (a card does not say whether the router is the plain softmax top-k that
    router_linear_topk fuses, so that one is not assumed)."""
    shared, packed = card.shared_experts > 0, card.expert_format is not None
    tensors = (6 if packed else 2) + (2 if card.expert_bias_params else 0)  # packed: weights + scales per matrix
    hybrid = card.state_bytes_per_sequence > 0 and 0 < card.attention_layers < card.num_layers
    every = card.num_layers // card.attention_layers if hybrid else 0
    linear = tuple(l for l in range(card.moe_layers) if (l + 1) % every) if hybrid else ()
    prologue = not hybrid and card.kv_bits >= 16
    return LayerShape(qk_norm=True, shared_expert=shared, shared_gate=shared, packed=packed,
                      tensors_per_expert=tensors, linear_layers=linear, out_gate=hybrid, fused_prologue=prologue,
                      fused_qkv=prologue, fused_adds=True)


def _prefill_totals(work, log, measured) -> dict[str, int]:
    """Launches, syncs and copies of the reported prefill calls (the double buffer's streamed copies among them)."""
    keep = log.phase == PREFILL if measured is None else (log.phase == PREFILL) & measured
    return {name: int(getattr(work, name)[keep].sum()) for name in ("launches", "syncs", "copies")}


def _per_token(work, log, measured) -> dict[str, float]:
    """Launches, syncs and copies per decode token (all layers) of the reported calls."""
    keep = log.phase == DECODE if measured is None else (log.phase == DECODE) & measured
    tokens = int((keep & (log.layer == 0)).sum())
    if not tokens:
        return {}
    return {name: float(getattr(work, name)[keep].sum() / tokens) for name in ("launches", "syncs", "copies")}
