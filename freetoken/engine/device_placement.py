"""Device placement: a compiled policy's array state held in device tensors, one Triton program per decision.

DEVICE_FORMS names the policies whose decision runs on the device (freetoken.kernels.placement): lru (admitting,
victim = least recent resident) and the pinned ones, static_layers and frequency (residency fixed: a lookup; fetches
stream through staging). Every split (offload, cpu, hybrid with each rule, fetch order, fetch_min_pairs, prefill
streaming) is decided there too. The others (belady, s3fifo, layer_sweep, lookahead, hinted_sweep, user classes)
keep the host path: device_form() says why in one line, which `ft generate` prints.

The device side must equal the host policy Plan by Plan; `plan()` reads a decision back into a Plan for that check
(and for the host-visible recorder), `decide()` leaves everything on the device.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from freetoken.placement.call import PREFILL, Call, Plan
from freetoken.placement.policy import PlacementPolicy
from freetoken.placement.split import Split

DEVICE_FORMS = ("lru", "static_layers", "frequency")


def device_form(policy: PlacementPolicy) -> str | None:
    """None when `policy` can decide on the device, else the one-line reason it keeps the host path."""
    from freetoken.placement import CompiledPolicy

    if policy.name not in DEVICE_FORMS:
        return f"placement {policy.name} has no device form (device: {', '.join(DEVICE_FORMS)}); it decides on the host"
    if not isinstance(policy, CompiledPolicy):
        return f"placement {policy.name} is the interpreted reference class; it decides on the host"
    if policy.calls_planned:
        return f"placement {policy.name} has already planned calls; it keeps deciding on the host"
    return None


def placement_line(policy: PlacementPolicy, on_device: bool = False, reason: str | None = None) -> str:
    """What `ft generate` says about where the policy decides (reason: why not on the device, if known)."""
    reason = reason or device_form(policy)
    if on_device:
        return f"placement: {policy.name} decides on the device (one Triton program per MoE call, no host round trip)"
    if reason is None:
        return f"placement: {policy.name} decides on the host (compiled; its device form runs on CUDA or --placement device)"
    return reason.replace("placement ", "placement: ", 1)


def _state_arrays(policy: PlacementPolicy) -> tuple[np.ndarray, ...]:
    """(slot_of, key_of_slot, last_use, ints = [CLOCK, USED]) of a fresh compiled policy's core."""
    core = policy.core
    return (core.slot_of.copy(), core.key_of_slot.copy(), core.last_use.copy(), core.counters[:2].copy())


@functools.lru_cache(maxsize=64)
def _fetch_counts(split: Split, num_experts: int) -> np.ndarray:
    """split.fetch_count(m) for m = 0..E (a call holds at most one layer's experts): the split's rule as a table."""
    return np.array([split.fetch_count(m) for m in range(num_experts + 1)], np.int32)


class DevicePolicy:
    """The decision of a fresh compiled `policy` (one of DEVICE_FORMS), on `device`. The host policy is not used
    afterwards: the device tensors are the state."""

    def __init__(self, policy: PlacementPolicy, device: torch.device | str = "cpu"):
        reason = device_form(policy)
        if reason is not None:
            raise ValueError(reason)
        dev = torch.device(device)
        self.name, self.capacity = policy.name, policy.capacity
        self.num_layers, self.num_experts = policy.num_layers, policy.num_experts
        self.admits = policy.admits
        self.state = tuple(torch.from_numpy(a).to(dev) for a in _state_arrays(policy))
        self.device = dev
        self._tables: dict[Split, torch.Tensor] = {}

    def load(self, policy: PlacementPolicy) -> None:
        """Take a fresh policy's state into the same tensors (their addresses stay: a captured graph reads them)."""
        reason = device_form(policy)
        if reason is not None:
            raise ValueError(reason)
        if (policy.capacity, policy.num_layers, policy.num_experts) != (self.capacity, self.num_layers,
                                                                         self.num_experts):
            raise ValueError("device placement: a policy of another shape cannot replace this state")
        for t, a in zip(self.state, _state_arrays(policy)):
            t.copy_(torch.from_numpy(a))

    def fetch_counts(self, split: Split) -> torch.Tensor:
        t = self._tables.get(split)
        if t is None:
            t = self._tables[split] = torch.from_numpy(_fetch_counts(split, self.num_experts)).to(self.device)
        return t

    def decide(self, layer: int, experts: torch.Tensor, tokens: torch.Tensor, split: Split, phase: int,
               out: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, ...]:
        """One call on the device (see kernels.placement.place_call for the outputs); no host sync."""
        from freetoken.kernels.placement import place_call

        if not 0 <= layer < self.num_layers:
            raise ValueError(f"call layer {layer} is out of range [0, {self.num_layers})")
        admit = self.admits and (split.admit_prefill or phase != PREFILL)
        return place_call(self.state, layer, experts, tokens, self.fetch_counts(split), split.fetch_order,
                          split.fetch_min_pairs, admit, out)

    def plan(self, call: Call, split: Split) -> Plan:
        """decide() on the call, read back as the host policy's Plan (syncs: for checks and host-side users)."""
        E = self.num_experts
        if call.experts and not (0 <= min(call.experts) and max(call.experts) < E):
            raise ValueError(f"call experts {call.experts} are out of range [0, {E})")
        experts = torch.tensor(call.experts, dtype=torch.int32, device=self.device)
        tokens = torch.tensor(call.tokens, dtype=torch.int32, device=self.device)
        kind, slot, _ce, _cs, evict, counts = self.decide(call.layer, experts, tokens, split, call.phase)
        kind, slot, evict, counts = kind.tolist(), slot.tolist(), evict.tolist(), counts.tolist()
        return Plan.from_kinds(call.layer, call.experts, kind, slot, evict[:counts[1]], num_experts=E)

    def slot(self, layer: int, expert: int) -> int:
        return int(self.state[0][layer * self.num_experts + expert])
