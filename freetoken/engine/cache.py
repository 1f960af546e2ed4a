"""The expert cache of a live run: a placement policy (the simulator's own classes), a miss split, the slot pool."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from freetoken.engine.executor import LiveExecutor
from freetoken.engine.kernelset import KernelSet
from freetoken.engine.slots import ExpertStore, SlotPool
from freetoken.placement import POLICIES, PlacementPolicy, Split, make_call, make_policy


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """capacity in expert slots, or fraction of all (layer, expert) pairs; neither: every expert resident.
    options go to the policy (profile= for frequency, future= a KeyStream for belady, n_cpu_layers=, ...)."""

    policy: str = "lru"
    capacity: int | None = None
    fraction: float | None = None
    split: Split = field(default_factory=Split)
    options: dict = field(default_factory=dict)
    staging: int | None = None  # staging buffers for unkept fetches (default: one layer's experts)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy: unknown {self.policy!r}; valid: {', '.join(sorted(POLICIES))}")
        if self.capacity is not None and self.fraction is not None:
            raise ValueError("give at most one of capacity (expert slots) or fraction (of all experts)")
        if self.capacity is not None and self.capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {self.capacity}")
        if self.fraction is not None and not 0 <= self.fraction <= 1:
            raise ValueError(f"fraction must lie in [0, 1], got {self.fraction}")
        if self.staging is not None and self.staging < 0:
            raise ValueError(f"staging must be >= 0, got {self.staging}")
        if POLICIES[self.policy].needs_future and "future" not in self.options:
            raise ValueError(f"policy {self.policy!r} needs the future: pass options={{'future': KeyStream}} "
                             f"built from a recorded trace (sim.calls.trace_key_stream)")

    def slots_for(self, num_keys: int) -> int:
        if self.capacity is not None:
            if self.capacity > num_keys:
                raise ValueError(f"capacity {self.capacity} exceeds the model's {num_keys} routed experts")
            return self.capacity
        if self.fraction is not None:
            return int(round(self.fraction * num_keys))
        return num_keys


class ExpertCache:
    def __init__(self, store: ExpertStore, config: CacheConfig, kernels: KernelSet, device: torch.device,
                 keep_plans: bool = False, pipeline: bool | None = None):
        self.store, self.config = store, config
        L, E = store.num_layers, store.num_experts
        self.capacity = config.slots_for(L * E)
        staging = E if config.staging is None else config.staging
        self.pool = SlotPool(self.capacity, staging, store, device)
        self.executor = LiveExecutor(store, self.pool, kernels, device, keep_plans, pipeline)
        self.policy = self._new_policy()

    def _new_policy(self) -> PlacementPolicy:
        L, E = self.store.num_layers, self.store.num_experts
        policy = make_policy(self.config.policy, self.capacity, L, E, **self.config.options)
        for key, slot in policy.slot_of.items():  # pinned warm start: resident before the first call
            self.pool.load(slot, self.store, *divmod(key, E))
        return policy

    def reset(self) -> None:
        """A fresh policy (empty or warm-started as at construction); counters and plans restart too."""
        self.policy = self._new_policy()
        ex = self.executor
        ex.reset_counts()
        if ex.plans is not None:
            ex.plans = []

    def __call__(self, layer: int, x: torch.Tensor, weights: torch.Tensor, ids: np.ndarray, phase: int,
                 request: int) -> torch.Tensor:
        """x [T, D], weights [T, K] fp32, ids [T, K] host expert ids of MoE layer `layer` -> [T, D]."""
        call = make_call(layer, ids, phase, request)
        plan = self.policy.plan(call, self.config.split)
        prefetch_slots = [self.policy.slot(l, e) for l, e in plan.prefetch]
        return self.executor.run(plan, x, weights, ids, phase, prefetch_slots)

    @property
    def counters(self):
        return self.executor.counters

    @property
    def decode_counters(self):
        return self.executor.phase_counters[1]

    @property
    def plans(self):
        return self.executor.plans
