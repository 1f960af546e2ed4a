"""The expert cache of a live run: a placement policy (the simulator's own classes), a miss split, the slot pool.

CacheConfig (freetoken.placement.config) is the one cache configuration of engine, simulator, CLIs and experiments.
Where the policy decides: `placement` auto (on the device on CUDA when the policy has a device form, else on the
host), device (error if it has none; on CPU it runs in Triton's interpreter) or host.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from freetoken.engine.device_moe import DeviceMoE, device_reason
from freetoken.engine.device_placement import placement_line
from freetoken.engine.executor import LiveExecutor
from freetoken.engine.kernelset import KernelSet
from freetoken.engine.slots import ExpertStore, SlotPool
from freetoken.placement import PREFILL, CacheConfig, CompiledPolicy, PlacementPolicy, build_policy, make_call
from freetoken.placement.callstream import layer_calls
from freetoken.placement.carry import DRAFTS, LiveCarry
from freetoken.placement.router_hint import ROUTER, LiveRouterHint
from freetoken.trace.format import MAX_EXPERTS


PLACEMENTS = ("auto", "device", "host")


class ExpertCache:
    def __init__(self, store: ExpertStore, config: CacheConfig, kernels: KernelSet, device: torch.device,
                 keep_plans: bool = False, pipeline: bool | None = None, host=None, placement: str = "auto"):
        self.store, self.config = store, config
        L, E = store.num_layers, store.num_experts
        self.capacity = config.slots_for(L, E)
        staging = E if config.staging is None else config.staging
        # a CPU-only engine with the host kernels computes every expert from the store: the pool aliases it
        alias = torch.device(device).type == "cpu" and kernels.name == "host" and placement != "device"
        self.pool = SlotPool(self.capacity, staging, store, device, alias=alias)
        self.executor = LiveExecutor(store, self.pool, kernels, device, keep_plans, pipeline, host)
        self.router_hint: LiveRouterHint | None = None  # the engine fills it before each call (hint="router")
        self.carry: LiveCarry | None = None  # the engine fills it before each verify forward (carry="drafts")
        self.policy = self._new_policy()
        self.device_moe: DeviceMoE | None = None
        self.placement_line = self._place(placement, torch.device(device))

    def _place(self, placement: str, device: torch.device) -> str:
        """Build the device decision where asked and possible; returns the line saying where the policy decides."""
        if placement not in PLACEMENTS:
            raise ValueError(f"placement {placement!r} is not one of {', '.join(PLACEMENTS)}")
        reason = device_reason(self.policy, self.pool.staging, self.store.num_experts)
        if placement == "device" and reason is not None:
            raise ValueError("placement device: " + reason.split(";")[0].removeprefix("placement "))
        if placement == "host" or reason is not None or (placement == "auto" and device.type != "cuda"):
            return placement_line(self.policy, on_device=False, reason=reason)
        self.device_moe = DeviceMoE(self.policy, self.config.split, self.executor)
        return placement_line(self.policy, on_device=True)

    def _new_policy(self) -> PlacementPolicy:
        E = self.store.num_experts
        config = self.config
        if config.options.get("hint") == ROUTER:  # the live early router: a fresh holder per policy
            self.router_hint = LiveRouterHint()
            config = replace(config, options={**config.options, "hint": self.router_hint})
        elif isinstance(config.options.get("hint"), str):
            raise ValueError(f"options: hint must be {ROUTER!r} (the engine's early router) or a hint object, got "
                             f"{config.options['hint']!r}")
        if config.options.get("carry") == DRAFTS:  # the rejected drafts of the verify forward before, live
            self.carry = LiveCarry(self.store.num_layers)
            config = replace(config, options={**config.options, "carry": self.carry})
        elif isinstance(config.options.get("carry"), str):
            raise ValueError(f"options: carry must be {DRAFTS!r} (the rejected drafts of the verify forward before), "
                             f"got {config.options['carry']!r}")
        policy = build_policy(config, self.store.num_layers, E)
        for key, slot in policy.slot_of.items():  # pinned warm start: resident before the first call
            self.pool.load(slot, self.store, *divmod(key, E))
        return policy

    def reset(self) -> None:
        """A fresh policy (empty or warm-started as at construction); counters and plans restart too."""
        self.policy = self._new_policy()
        if self.device_moe is not None:
            self.device_moe.reset(self.policy)
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
        return self.executor.run(plan, x, weights, ids, phase, prefetch_slots, self._stream_next(layer, phase))

    def account(self, layer: int, ids: np.ndarray, phase: int, request: int) -> None:
        """A call a CPU-only engine computed already (host_decode.py: every routed expert from the store, as
        executor.run's host-only path does): planned and counted as __call__ would."""
        self.executor.tally(self.policy.plan(make_call(layer, ids, phase, request), self.config.split), ids, phase)

    def account_step(self, ids: np.ndarray, phase: int, request: int) -> None:
        """A CPU-only engine's whole step (ids [L, B, K]: every MoE layer's routing, layer order), planned and
        counted as account() per layer would: a compiled policy replays the step's L calls in one compiled run (the
        simulator's stream replay, equal to plan() call by call), where planning layer by layer from Python cost
        11-30 us per layer; kept Plans, reference policies and expert ids past a trace's int16 take account() per
        layer."""
        if (self.executor.plans is not None or not isinstance(self.policy, CompiledPolicy)
                or self.policy.num_experts > MAX_EXPERTS):
            for layer in range(len(ids)):
                self.account(layer, ids[layer], phase, request)
            return
        stream = layer_calls(ids, self.policy.num_experts, phase, request)
        log = np.empty((10, stream.num_calls), np.int64)  # (rows 8, 9: a stream replay's own columns)
        self.policy.replay(stream, self.config.split, 0, stream.num_calls, log)
        self.executor.tally_log(log, phase)

    def _stream_next(self, layer: int, phase: int) -> list[int] | None:
        """Layer l+1's non-resident experts for the prefill double buffer: only where every prefill miss is fetched
        (offload) and none is admitted (so the set cannot change before layer l+1's call), within the forward."""
        split, policy = self.config.split, self.policy
        if (not self.executor.stream_prefill or phase != PREFILL or layer + 1 >= self.store.num_layers
                or split.mode != "offload" or (policy.admits and split.admit_prefill)):
            return None
        return [e for e in range(self.store.num_experts) if policy.slot(layer + 1, e) < 0]

    @property
    def counters(self):
        return self.executor.counters

    @property
    def decode_counters(self):
        return self.executor.phase_counters[1]

    @property
    def plans(self):
        return self.executor.plans
