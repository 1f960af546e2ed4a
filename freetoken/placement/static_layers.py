"""Static layer split (llama.cpp --n-cpu-moe N): the experts of the first N MoE layers stay on the CPU,
every expert of the other layers is resident. --cpu-moe is N = all layers."""

from __future__ import annotations

from freetoken.placement.policy import PlacementPolicy


def cpu_layers_for(capacity: int, num_layers: int, num_experts: int) -> int:
    """The smallest N whose resident layers fit: N = L - floor(capacity / E)."""
    return num_layers - min(num_layers, capacity // num_experts)


class StaticLayers(PlacementPolicy):
    name = "static_layers"
    admits = False

    def __init__(self, capacity: int, num_layers: int, num_experts: int, n_cpu_layers: int | None = None):
        super().__init__(capacity, num_layers, num_experts)
        if n_cpu_layers is None:
            n_cpu_layers = cpu_layers_for(capacity, num_layers, num_experts)
        if not 0 <= n_cpu_layers <= num_layers:
            raise ValueError(f"n_cpu_layers must lie in [0, {num_layers}], got {n_cpu_layers}")
        need = (num_layers - n_cpu_layers) * num_experts
        if need > capacity:
            raise ValueError(f"n_cpu_layers={n_cpu_layers} keeps {num_layers - n_cpu_layers} layers resident, "
                             f"which needs {need} expert slots; capacity is {capacity}")
        self.n_cpu_layers = n_cpu_layers
        self._place_pinned(range(n_cpu_layers * num_experts, num_layers * num_experts))
