"""Start-up memory plan: the device budget split between dense weights, the KV cache and expert slots.

Order of claims: a reserve (activations, workspace), the dense weights, the KV floor, then expert slots, then any
memory left (all experts resident) goes back to the KV cache. The expert cache never grows into the KV floor;
a floor that does not fit is an error naming what to change, not a silently short context.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30
MiB = 1 << 20
DEFAULT_KV_FLOOR = 32768  # tokens: a useful agent context, capped by the model's own context length


def fmt_bytes(b: int) -> str:
    return f"{b / GiB:.2f} GiB" if b >= GiB // 10 else f"{b / MiB:.2f} MiB"


@dataclass(frozen=True, slots=True)
class ModelMemory:
    """What the model needs, in bytes: dense (non-expert) weights, KV per token, one routed expert."""

    dense_bytes: int
    kv_bytes_per_token: int
    expert_bytes: int
    num_experts: int  # routed experts in all layers together (layers x experts)
    min_slots: int  # slots the engine needs at least (the experts of one layer call)
    max_context: int
    state_bytes: int = 0  # per sequence, whatever its length: linear-attention conv + recurrent states (hybrids)

    def __post_init__(self) -> None:
        for name in ("kv_bytes_per_token", "expert_bytes", "num_experts", "max_context"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model memory: {name} must be positive, got {getattr(self, name)}")
        if self.dense_bytes < 0:
            raise ValueError(f"model memory: dense_bytes must be >= 0, got {self.dense_bytes}")
        if not 0 <= self.min_slots <= self.num_experts:
            raise ValueError(f"model memory: min_slots must lie in [0, {self.num_experts}], got {self.min_slots}")


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    budget_bytes: int
    reserve_bytes: int
    dense_bytes: int
    kv_tokens: int
    kv_bytes: int
    kv_floor: int
    expert_slots: int
    expert_bytes: int  # of all slots
    num_experts: int
    device: str

    @property
    def free_bytes(self) -> int:
        return self.budget_bytes - self.reserve_bytes - self.dense_bytes - self.kv_bytes - self.expert_bytes

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__} | {"free_bytes": self.free_bytes}

    def table(self) -> str:
        def g(b):
            return f"{fmt_bytes(b):>12s}"

        pct = self.expert_slots / self.num_experts
        return "\n".join([
            f"memory plan ({self.device}, budget {fmt_bytes(self.budget_bytes)}):",
            f"  reserve       {g(self.reserve_bytes)}",
            f"  dense weights {g(self.dense_bytes)}",
            f"  KV cache      {g(self.kv_bytes)}  {self.kv_tokens} tokens (floor {self.kv_floor})",
            f"  expert slots  {g(self.expert_bytes)}  {self.expert_slots} of {self.num_experts} experts ({pct:.0%})",
            f"  free          {g(self.free_bytes)}",
        ])


def cache_rows(plan: MemoryPlan, layer_experts: int) -> tuple[int, int]:
    """(policy slots, staging rows) of the planned slot pool: one layer's experts of staging (fetched, not kept)
    beside the policy's cache, none when every expert is resident. The engine and the sim split alike."""
    staging = 0 if plan.expert_slots >= plan.num_experts else layer_experts
    return plan.expert_slots - staging, staging


def plan_memory(model: ModelMemory, budget_bytes: int, kv_floor: int | None = None, reserve_bytes: int = 0,
                kv_cap: int | None = None, device: str = "device") -> MemoryPlan:
    """kv_floor: tokens the KV cache gets before any expert slot (default min(max_context, 32768));
    kv_cap: most KV tokens worth having (default: no cap beyond what is left)."""
    floor = min(model.max_context, DEFAULT_KV_FLOOR) if kv_floor is None else kv_floor
    if floor <= 0:
        raise ValueError(f"--kv-floor must be positive, got {floor}")
    if budget_bytes <= 0 or reserve_bytes < 0:
        raise ValueError(f"memory budget must be positive and the reserve >= 0, got {budget_bytes}, {reserve_bytes}")
    available = budget_bytes - reserve_bytes - model.dense_bytes
    floor_bytes = floor * model.kv_bytes_per_token + model.state_bytes  # the floor's sequence keeps its states too
    staging = model.min_slots * model.expert_bytes
    if available < floor_bytes + staging:
        raise ValueError(
            f"KV floor of {floor} tokens ({fmt_bytes(floor_bytes)}) and {model.min_slots} expert slots "
            f"({fmt_bytes(staging)}) do not fit: {device} budget {fmt_bytes(budget_bytes)} minus dense weights "
            f"{fmt_bytes(model.dense_bytes)} and reserve {fmt_bytes(reserve_bytes)} leaves "
            f"{fmt_bytes(max(available, 0))}; lower --kv-floor or raise the budget")
    slots = min(model.num_experts, (available - floor_bytes) // model.expert_bytes)
    left = available - floor_bytes - slots * model.expert_bytes
    kv_tokens = floor + left // model.kv_bytes_per_token
    if kv_cap is not None:
        kv_tokens = max(floor, min(kv_tokens, kv_cap))
    return MemoryPlan(budget_bytes, reserve_bytes, model.dense_bytes, kv_tokens,
                      kv_tokens * model.kv_bytes_per_token + model.state_bytes,
                      floor, slots, slots * model.expert_bytes, model.num_experts, device)
