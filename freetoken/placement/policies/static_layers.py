"""Static layer split (llama.cpp --n-cpu-moe N): the experts of the first N MoE layers stay on the CPU,
every expert of the other layers is resident. --cpu-moe is N = all layers."""

from __future__ import annotations

import numbers

from freetoken.placement.config import ConfigError
from freetoken.placement.compiled.form import pinned
from freetoken.placement.policy import PlacementPolicy


def cpu_layers_for(capacity: int, num_layers: int, num_experts: int) -> int:
    """The smallest N whose resident layers fit: N = L - floor(capacity / E)."""
    return num_layers - min(num_layers, capacity // num_experts)


def check_cpu_layers(n_cpu_layers, num_layers: int, whose: str = "the MoE layers") -> None:
    """N in [0, L], a whole number; the entry point words the field (--n-cpu-moe in `ft`, policy.options.n_cpu_layers
    under Hydra). whose: how the message names the layers (a CLI checks a checkpoint's config.json before its
    weights load, and names that file)."""
    whole = isinstance(n_cpu_layers, numbers.Integral) and not isinstance(n_cpu_layers, bool)  # numpy's too
    if not (whole and 0 <= n_cpu_layers <= num_layers):
        raise ConfigError("{n_cpu_layers} must lie in [0, {L}] ({whose}), got {v}", L=num_layers, whose=whose,
                          v=int(n_cpu_layers) if whole else repr(n_cpu_layers))


class StaticLayers(PlacementPolicy):
    name = "static_layers"
    admits = False

    def __init__(self, capacity: int, num_layers: int, num_experts: int, n_cpu_layers: int | None = None):
        super().__init__(capacity, num_layers, num_experts)
        if n_cpu_layers is None:
            n_cpu_layers = cpu_layers_for(capacity, num_layers, num_experts)
        check_cpu_layers(n_cpu_layers, num_layers)  # ConfigErrors: worded by the entry point
        need = (num_layers - n_cpu_layers) * num_experts
        if need > capacity:
            raise ConfigError("{n_cpu_layers}={n} keeps {r} layers resident, which needs {need} expert slots; the "
                              "cache has {c}", n=n_cpu_layers, r=num_layers - n_cpu_layers, need=need, c=capacity)
        self.n_cpu_layers = n_cpu_layers
        self._place_pinned(range(n_cpu_layers * num_experts, num_layers * num_experts))


# ── compiled: residency fixed at the start, nothing to decide but the split (compiled/form.py) ──────────────────────
StaticLayers.compiled = pinned(StaticLayers)
