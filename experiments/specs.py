"""Typed, validated views of the conf groups the entry points read (each one is a `_target_` in conf/).

Every check names the config key at fault (`cache.fraction`, `policy.options`), so a bad override fails in one line.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path

from freetoken.placement import POLICIES

# Options the simulator builds itself: a profile from a trace, the future key stream for offline policies.
_INJECTED = {"profile", "future"}


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """name: a key of freetoken.placement.POLICIES; options: its constructor's keyword arguments.

    profile: trace spec whose expert counts pin experts for `frequency` (None: the replayed trace, in-sample).
    """

    name: str
    options: dict = field(default_factory=dict)
    profile: "TraceSpec | None" = None

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"policy.name: unknown {self.name!r}; valid: {', '.join(sorted(POLICIES))}")
        params = set(inspect.signature(POLICIES[self.name].__init__).parameters)
        accepted = params - {"self", "capacity", "num_layers", "num_experts"} - _INJECTED
        unknown = set(self.options) - accepted
        if unknown:
            raise ValueError(f"policy.options: {self.name} takes no option {', '.join(sorted(unknown))}; "
                             f"it takes: {', '.join(sorted(accepted)) or 'none'}")
        if self.profile is not None and self.name != "frequency":
            raise ValueError(f"policy.profile: only frequency reads a profile trace, not {self.name}")

    def constructor_options(self) -> dict:
        """Options with unset (None) values dropped, so the policy's own defaults apply."""
        return {k: v for k, v in self.options.items() if v is not None}


@dataclass(frozen=True, slots=True)
class CacheSpec:
    """GPU expert slots: an absolute capacity or a fraction of all (layer, expert) pairs; exactly one."""

    fraction: float | None = None
    capacity: int | None = None

    def __post_init__(self) -> None:
        if (self.fraction is None) == (self.capacity is None):
            raise ValueError("cache: give exactly one of cache.fraction or cache.capacity (set the other to null)")
        if self.fraction is not None and not (isinstance(self.fraction, (int, float)) and 0 < self.fraction <= 1):
            raise ValueError(f"cache.fraction must lie in (0, 1], got {self.fraction}")
        if self.capacity is not None and not (isinstance(self.capacity, int) and self.capacity >= 0):
            raise ValueError(f"cache.capacity must be a whole number of expert slots >= 0, got {self.capacity}")


@dataclass(frozen=True, slots=True)
class SimSpec:
    prefill_chunk: int = 2048
    expert_bytes: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.prefill_chunk, int) and self.prefill_chunk > 0):
            raise ValueError(f"sim.prefill_chunk must be a positive number of tokens, got {self.prefill_chunk}")
        if not (isinstance(self.expert_bytes, int) and self.expert_bytes >= 0):
            raise ValueError(f"sim.expert_bytes must be >= 0, got {self.expert_bytes}")


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
        from experiments.traces import load_trace

        return load_trace(self)

    @property
    def file(self) -> Path | None:
        return None if self.path is None else Path(self.path)
