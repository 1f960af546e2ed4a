"""Typed, validated views of the conf groups the entry points read (each one is a `_target_` in conf/).

Every check names the config key at fault (`cache.fraction`, `policy.options`), so a bad override fails in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from freetoken.placement import DEFAULT_PREFILL_CHUNK, Split, cache_config
from freetoken.placement.config import SOURCE_OPTIONS, ConfigError, policy_option_names

# How the conf groups spell the one cache config's fields (errors name the key to override).
HYDRA_NAMES = {"policy": "policy.name", "options": "policy.options", "profile": "policy.profile",
               "capacity": "cache.capacity", "fraction": "cache.fraction", "split": "split",
               "prefill_chunk": "sim.prefill_chunk", "expert_bytes": "sim.expert_bytes",
               "n_cpu_layers": "policy.options.n_cpu_layers",
               **{f: f"split.{f}" for f in ("mode", "rule", "bp", "bh", "max_fetch")}}


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """name: a key of freetoken.placement.POLICIES; options: its constructor's keyword arguments.

    profile: trace spec whose expert counts a policy reads (frequency's pinned set, ktransformers_dynamic's start,
    lru's split=profile quotas, moe_infinity's library; None: the replayed trace, in-sample, except moe_infinity's).
    Checked by the one cache config (freetoken.placement.CacheConfig), as every entry point's policy is.
    """

    name: str
    options: dict = field(default_factory=dict)
    profile: "TraceSpec | None" = None

    def __post_init__(self) -> None:
        injected = sorted(set(self.options) & set(SOURCE_OPTIONS))
        if injected:
            raise ValueError(f"policy.options: {', '.join(injected)} is built from data, not set in a config "
                             f"(frequency: policy.profile, a trace spec)")
        cache_config(HYDRA_NAMES, policy=self.name, options=self.options, fraction=1.0)
        if self.profile is not None and not {"profile", "past"} & policy_option_names(self.name):
            raise ValueError(f"policy.profile: {self.name} reads no profile trace (frequency, "
                             f"ktransformers_dynamic, lru and moe_infinity do)")

    def constructor_options(self) -> dict:
        """Options with unset (None) values dropped, so the policy's own defaults apply."""
        return {k: v for k, v in self.options.items() if v is not None}


@dataclass(frozen=True, slots=True)
class CacheSpec:
    """GPU expert slots: an absolute capacity or a fraction of all (layer, expert) pairs; exactly one (the one
    cache config's rule: fraction in (0, 1], capacity >= 0)."""

    fraction: float | None = None
    capacity: int | None = None

    def __post_init__(self) -> None:
        cache_config(HYDRA_NAMES, fraction=self.fraction, capacity=self.capacity)


@dataclass(frozen=True, slots=True)
class SimSpec:
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    expert_bytes: int = 0

    def __post_init__(self) -> None:
        from freetoken.sim.run import SimConfig

        try:
            SimConfig(fraction=1.0, prefill_chunk=self.prefill_chunk, expert_bytes=self.expert_bytes)
        except ConfigError as e:
            raise ValueError(e.render(HYDRA_NAMES)) from None


def sim_config(policy: PolicySpec, split: Split, cache: CacheSpec, sim: SimSpec):
    """The one cache config of a replay or live run, built by field name from the conf groups."""
    from freetoken.sim.run import SimConfig

    try:
        return SimConfig(policy=policy.name, options=policy.constructor_options(), split=split,
                         capacity=cache.capacity, fraction=cache.fraction, prefill_chunk=sim.prefill_chunk,
                         expert_bytes=sim.expert_bytes)
    except ConfigError as e:
        raise ValueError(e.render(HYDRA_NAMES)) from None


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """A routing trace: a saved file (path, read by `format`), or a synthetic spec; optionally its first requests.

    name: the label results and figures use. format: `safetensors`, an importer name (freetoken.trace.importers)
    or `auto` (the importer recognises the file); import_options go to that importer.
    """

    name: str
    path: str | None = None
    format: str = "safetensors"
    import_options: dict = field(default_factory=dict)
    synth: dict | None = None
    requests: int | None = None  # keep only the first N requests (None: all)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("trace.name must be a non-empty label")
        if (self.path is None) == (self.synth is None):
            raise ValueError(f"trace {self.name}: give exactly one of trace.path or trace.synth")
        if self.format not in ("safetensors", "auto"):
            from freetoken.trace.importers import IMPORTERS

            if self.format not in IMPORTERS:
                raise ValueError(f"trace.format: unknown {self.format!r}; valid: safetensors, auto, "
                                 f"{', '.join(IMPORTERS)}")
        if self.requests is not None and not (isinstance(self.requests, int) and self.requests > 0):
            raise ValueError(f"trace.requests must be a positive count or null, got {self.requests}")

    def load(self):
        from freetoken.experiments.traces import load_trace

        return load_trace(self)

    @property
    def file(self) -> Path | None:
        return None if self.path is None else Path(self.path)


@dataclass(frozen=True, slots=True)
class PredictSpec:
    """What the cost model is asked to run: a workload of the model's shape and the host contention model.

    workload: synthetic (one request: prompt then decode, routed like the model's shape), conversation
    (multi-turn; anchors=false re-prefills the whole history every turn, as a server without KV reuse does),
    or trace (the trace group, which must have the model's shape).
    """

    workload: str = "synthetic"
    prompt_tokens: int = 4096
    decode_tokens: int = 256
    turns: int = 1  # conversation: turns per conversation (each: prompt_tokens new, decode_tokens reply)
    conversations: int = 1
    anchors: bool = True
    host: str = "shared"  # shared: PCIe DMA and CPU lane draw from one DRAM | independent
    min_context: int | None = None  # KV tokens guaranteed before expert slots (None: the planner's floor)
    n_cpu_layers: int | None = None  # static-layer engines: MoE layers on the CPU (None: the engine's rule)
    per_turn: bool = False  # also write one row per turn (latency, TTFT) to <table>_turns
    seed: int = 0

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"predict.workload: unknown {self.workload!r}; valid: {', '.join(WORKLOADS)}")
        for name in ("prompt_tokens", "decode_tokens"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 0):
                raise ValueError(f"predict.{name} must be a token count >= 0, got {v!r}")
        if self.prompt_tokens + self.decode_tokens == 0:
            raise ValueError("predict.prompt_tokens and predict.decode_tokens cannot both be 0")
        for name in ("turns", "conversations"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v > 0):
                raise ValueError(f"predict.{name} must be a positive count, got {v!r}")
        if self.host not in ("shared", "independent"):
            raise ValueError(f"predict.host: unknown {self.host!r}; valid: shared, independent")
        if self.min_context is not None and not (isinstance(self.min_context, int) and self.min_context > 0):
            raise ValueError(f"predict.min_context must be a positive token count or null, got {self.min_context!r}")
        if self.n_cpu_layers is not None and not (isinstance(self.n_cpu_layers, int) and self.n_cpu_layers >= 0):
            raise ValueError(f"predict.n_cpu_layers must be >= 0 or null, got {self.n_cpu_layers!r}")


WORKLOADS = ("synthetic", "conversation", "trace")


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """An engine configuration by name: a key of sim.engines.ENGINES (policy + split + overlap, no code of its own),
    with the settings of the run (None: the engine's default; sim.engines.with_settings checks them)."""

    name: str
    prefill_chunk: int | None = None  # tokens per prefill call (llama.cpp: its ubatch)
    gguf_type: str | None = None  # llama.cpp: the GGUF file type (bits per weight, GEMM path)
    expert_format: str | None = None  # the routed experts' format (freetoken.quant FORMAT_SPECS or a bits name)
    cuda_graphs: bool | None = None
    cpu_threads: int | None = None  # CPU-lane threads (KTransformers' cpu_infer)
    amx: bool | None = None  # KTransformers' AMX backend
    kv_dtype: str | None = None  # KV cache storage: auto | bf16 | fp8 (freetoken.kv_dtype)
    double_buffer: bool | None = None  # freetoken-offload's prefill double buffer (two layers of staging slots)
    decode_overlap: bool | None = None  # decode's copies beside the hits' compute (False: FreeToken 0.1.2's gather)
    prefill_split: str | None = None  # same (as decode) | offload (every miss fetched: FreeToken 0.1.2's hybrid)
    decode_gather_gb_s: float | None = None  # decode's copies at this rate (an SM gather: FreeToken 0.1.2's); 0: BP
    prefill_copies: str | None = None  # missing (a call's missing experts) | layer (its whole layer: FreeToken 0.1.2)

    def __post_init__(self) -> None:
        from freetoken.sim.engines import ENGINES

        if self.name not in ENGINES:
            raise ValueError(f"engine.name: unknown {self.name!r}; valid: {', '.join(ENGINES)}")
        for name in ("cuda_graphs", "amx", "double_buffer", "decode_overlap"):
            if not (getattr(self, name) is None or isinstance(getattr(self, name), bool)):
                raise ValueError(f"engine.{name} must be true, false or null, got {getattr(self, name)!r}")
        gather = self.decode_gather_gb_s
        if gather is not None and (isinstance(gather, bool) or not isinstance(gather, (int, float)) or not gather >= 0):
            raise ValueError(f"engine.decode_gather_gb_s must be a number >= 0 or null, got {gather!r}")
        try:  # every other setting (prefill_split, prefill_copies among them) is checked once, by sim.engines.Engine
            self.engine()
        except ValueError as e:
            raise ValueError(f"engine: {e}") from None

    def engine(self):
        """The sim.engines.Engine these settings describe."""
        from freetoken.sim.engines import get_engine, with_settings

        return with_settings(get_engine(self.name), prefill_chunk=self.prefill_chunk, gguf_type=self.gguf_type,
                             expert_format=self.expert_format, cuda_graphs=self.cuda_graphs,
                             cpu_threads=self.cpu_threads, amx=self.amx, kv_dtype=self.kv_dtype,
                             double_buffer=self.double_buffer, decode_overlap=self.decode_overlap,
                             prefill_split=self.prefill_split, decode_gather_gb_s=self.decode_gather_gb_s,
                             prefill_copies=self.prefill_copies)


@dataclass(frozen=True, slots=True)
class LiveSpec:
    """A live run: a local HF MoE checkpoint (None: a tiny random Qwen3-MoE one, built once under the results dir)
    serving `requests` seeded random prompts of prompt_tokens, each decoding decode_tokens greedily."""

    checkpoint: str | None = None
    requests: int = 2
    prompt_tokens: int = 16
    decode_tokens: int = 8
    kernels: str = "triton"  # triton | reference (torch)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("requests", "prompt_tokens", "decode_tokens"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v > 0):
                raise ValueError(f"live.{name} must be a positive count, got {v!r}")
        if self.kernels not in ("triton", "reference"):
            raise ValueError(f"live.kernels: unknown {self.kernels!r}; valid: triton, reference")
        if self.checkpoint is not None and not Path(self.checkpoint).is_dir():
            raise ValueError(f"live.checkpoint: {self.checkpoint} is not a checkpoint directory")
