"""The sim's memory plan: a model card on a hardware profile, through the engine's own start-up planner.

freetoken.placement.memory.plan_memory decides the order of claims (reserve, dense weights, KV floor, expert slots);
this module only turns a card and a profile into its inputs, so the sim and the engine size the cache alike.
"""

from __future__ import annotations

from freetoken.placement.memory import (
    DEFAULT_KV_FLOOR,
    MemoryPlan,
    ModelMemory,
    cache_rows,
    plan_memory,
)
from freetoken.sim.hardware import HardwareProfile
from freetoken.sim.model_card import ModelCard

UNBOUNDED_CONTEXT = 1 << 24  # cards carry no context limit; the floor is the caller's choice


def model_memory(card: ModelCard, staging_layers: int = 1) -> ModelMemory:
    """min_slots: staging_layers layers' experts, the staging rows the engine's slot pool keeps beside the cache."""
    return ModelMemory(dense_bytes=card.dense_bytes() + card.embedding_bytes(),
                       kv_bytes_per_token=card.kv_bytes_per_token, expert_bytes=card.expert_bytes(),
                       num_experts=card.num_keys, min_slots=staging_layers * card.num_experts, max_context=UNBOUNDED_CONTEXT,
                       state_bytes=card.state_bytes_per_sequence)


def plan_for(card: ModelCard, hw: HardwareProfile, min_context: int = DEFAULT_KV_FLOOR,
             staging_layers: int = 1) -> MemoryPlan:
    """Expert slots of `card` on `hw` with `min_context` tokens of KV cache guaranteed."""
    return plan_memory(model_memory(card, staging_layers), int(hw.vram_bytes), kv_floor=min_context,
                       reserve_bytes=int(hw.reserved_bytes), device=f"{hw.name} ({hw.gpu})")


def policy_capacity(plan: MemoryPlan, card: ModelCard, staging_layers: int = 1) -> int:
    """Slots the placement policy gets: the planned slots less `staging_layers` layers of staging (as the engine
    splits them: one by default, two for the prefill double buffer)."""
    return cache_rows(plan, staging_layers * card.num_experts)[0]


__all__ = ["DEFAULT_KV_FLOOR", "MemoryPlan", "plan_for", "policy_capacity"]
