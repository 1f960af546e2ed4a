"""Server configuration: one typed record, validated once."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 1919
DEMO_MODEL_ID = "freetoken-demo"
BACKENDS = ("engine", "hf")  # freetoken's own engine | HF transformers (the reference path)
CACHE_FLAGS = {"policy_options": "--policy-option / --n-cpu-moe / --cpu-moe / --scope", "profile": "--profile-trace",
               "capacity": "--capacity", "fraction": "--fraction"}  # engine backend only
DEFAULT_MAX_BODY_MB = 32.0  # request bodies beyond this get a 413 while they stream in
DEFAULT_MAX_RUNNING = 4  # requests decoded together (FreeToken's own default batch)


@dataclass(frozen=True, slots=True)
class ServeConfig:
    model: Path | None = None  # checkpoint directory; None: the shipped demo model
    served_name: str | None = None  # model id clients ask for (default: the directory name)
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    backend: str = "engine"
    max_running: int = DEFAULT_MAX_RUNNING
    max_waiting: int = 64
    kv_floor: int | None = None  # tokens; None: min(context, 32768)
    device_budget_gb: float | None = None  # CPU machines (and overrides): the "device" memory to plan against
    prefix_cache_tokens: int | None = None  # None: the planned KV tokens
    max_context: int | None = None  # None: the model's own
    kv_dtype: str = "auto"  # KV cache storage: auto (the model's dtype) | bf16 | fp8 (engine backend)
    lm_head: str = "checkpoint"  # the LM head: the checkpoint's | int8 (quantized at load; engine backend on a CPU)
    policy: str = "lru"  # expert placement policy of the engine's cache
    policy_options: dict = field(default_factory=dict)  # its constructor options (n_cpu_layers, scope, decay, ...)
    profile: str | None = None  # frequency: trace file whose counts pick the pinned experts
    capacity: int | None = None  # policy slots instead of the plan's (at most what the plan leaves)
    fraction: float | None = None  # the same as a fraction of all experts
    split: str = "auto"  # miss split: auto (offload unless this machine's bandwidth profile says hybrid) | ...
    placement: str = "auto"  # where the policy decides: auto (the device on CUDA when it can) | device | host
    eager: bool = False  # no CUDA graphs for the decode step
    threads: int | None = None  # CPU threads (torch, the CPU lane); None: torch's default
    api_key: str | None = None  # None: FT_API_KEY from the environment, else no authentication
    max_body_mb: float = DEFAULT_MAX_BODY_MB
    tool_parser: str = "auto"  # auto: the model family's own tool-call format
    reasoning_parser: str = "auto"  # auto: the model family's own reasoning format (none for families without)
    trust_request_chat_template: bool = False  # accept a request's own chat_template (vLLM's flag of that name)

    @property
    def resolved_api_key(self) -> str | None:
        import os

        return self.api_key or os.environ.get("FT_API_KEY") or None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must lie in 0..65535, got {self.port}")
        if self.max_running < 1:
            raise ValueError(f"--max-running must be >= 1, got {self.max_running}")
        if self.max_waiting < 0:
            raise ValueError(f"--max-waiting must be >= 0, got {self.max_waiting}")
        if self.device_budget_gb is not None and not 0 < self.device_budget_gb < math.inf:  # nan fails too
            raise ValueError(f"--device-budget must be a positive, finite number of GiB, got {self.device_budget_gb}")
        for name in ("kv_floor", "max_context"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if not 0 < self.max_body_mb < math.inf:
            raise ValueError(f"--max-body-mb must be a positive, finite number, got {self.max_body_mb}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("--api-key must not be empty")
        from freetoken.serve.parsers import REASONING_PARSERS, TOOL_PARSERS

        for name, table in (("tool_parser", TOOL_PARSERS), ("reasoning_parser", REASONING_PARSERS)):
            if getattr(self, name) != "auto" and getattr(self, name) not in table:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)!r} is not one of auto, "
                                 f"{', '.join(table)}")
        if self.prefix_cache_tokens is not None and self.prefix_cache_tokens < 0:
            raise ValueError(f"--prefix-cache-tokens must be >= 0, got {self.prefix_cache_tokens}")
        from freetoken.kv_dtype import check_kv_dtype

        check_kv_dtype(self.kv_dtype)
        from freetoken.quant.head import check_lm_head

        check_lm_head(self.lm_head)
        if self.backend == "hf" and self.lm_head != "checkpoint":
            raise ValueError(f"--lm-head {self.lm_head} applies to the engine backend")
        if self.backend == "hf" and self.kv_dtype != "auto":
            raise ValueError(f"--kv-dtype {self.kv_dtype} applies to the engine backend (the hf backend keeps "
                             f"transformers' cache)")
        from freetoken.calibrate.mode import SPLIT_MODES
        from freetoken.placement import POLICIES, cache_config

        if self.policy not in POLICIES or POLICIES[self.policy].needs_future:
            valid = sorted(k for k, v in POLICIES.items() if not v.needs_future)
            raise ValueError(f"--policy {self.policy!r} is not one of {', '.join(valid)} (online policies)")
        from freetoken.engine.cache import PLACEMENTS
        from freetoken.engine.device_placement import DEVICE_FORMS

        if self.placement not in PLACEMENTS:
            raise ValueError(f"--placement {self.placement!r} is not one of {', '.join(PLACEMENTS)}")
        if self.placement == "device" and self.policy not in DEVICE_FORMS:
            raise ValueError(f"--placement device: policy {self.policy} has no device form (device: "
                             f"{', '.join(DEVICE_FORMS)}); use --placement auto or host")
        if self.threads is not None and self.threads <= 0:
            raise ValueError(f"--threads must be positive, got {self.threads}")
        if self.backend != "engine":
            if self.policy != "lru" or self.split != "auto":
                raise ValueError(f"--policy / --split do nothing for --backend {self.backend} (no expert cache)")
            for name, flag in CACHE_FLAGS.items():
                if getattr(self, name) not in (None, {}):
                    raise ValueError(f"{flag} does nothing for --backend {self.backend} (no expert cache)")
            if self.placement != "auto" or self.eager:
                raise ValueError(f"--placement / --eager do nothing for --backend {self.backend} (no expert cache)")
        size = {"capacity": self.capacity, "fraction": self.fraction}
        if self.capacity is None and self.fraction is None:
            size = {"fraction": 1.0}  # the plan's slots: checked when the plan is known
        cache_config(SERVE_NAMES, policy=self.policy, options=self.policy_options, profile=self.profile, **size)
        if self.policy == "frequency" and self.profile is None and "profile" not in self.policy_options:
            raise ValueError("--policy frequency needs --profile-trace (a trace whose counts pick the pinned experts)")
        if self.split not in SPLIT_MODES:
            raise ValueError(f"--split {self.split!r} is not one of {', '.join(SPLIT_MODES)}")
        if self.profile is not None and not Path(self.profile).is_file():
            raise ValueError(f"--profile-trace {self.profile}: no such trace file")
        if self.model is not None and not self.model.is_dir():
            raise ValueError(f"--model {self.model}: not a directory")


SERVE_NAMES = {"policy": "--policy", "options": "--policy-option", "profile": "--profile-trace",
               "capacity": "--capacity", "fraction": "--fraction", "split": "--split", "mode": "--split"}
