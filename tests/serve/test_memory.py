"""Memory planner on hand-computed splits."""

from __future__ import annotations

import pytest

from freetoken.placement.memory import GiB, ModelMemory, plan_memory

MiB = 1 << 20
# a toy model: 2 GiB dense, 96 KiB of KV per token, 9 MiB experts, 48 layers x 128 experts, top-8
MODEL = ModelMemory(dense_bytes=2 * GiB, kv_bytes_per_token=96 << 10, expert_bytes=9 * MiB, num_experts=48 * 128,
                    min_slots=8, max_context=262144)


def test_kv_floor_is_claimed_before_expert_slots():
    # 24 GiB - 1 GiB reserve - 2 GiB dense = 21 GiB; floor 32768 tokens * 96 KiB = 3 GiB;
    # 18 GiB / 9 MiB = 2048 slots exactly, nothing left over
    plan = plan_memory(MODEL, 24 * GiB, reserve_bytes=1 * GiB)
    assert plan.kv_floor == 32768 and plan.kv_tokens == 32768
    assert plan.expert_slots == 2048 and plan.free_bytes == 0
    assert "2048 of 6144 experts (33%)" in plan.table()


def test_memory_left_after_all_experts_goes_to_kv():
    # 64 GiB - 2 GiB = 62 GiB; all 6144 experts = 54 GiB; floor 3 GiB; 5 GiB more = 54613 tokens more
    plan = plan_memory(MODEL, 64 * GiB)
    assert plan.expert_slots == 6144
    assert plan.kv_tokens == 32768 + (5 * GiB) // (96 << 10)
    assert plan.free_bytes < 96 << 10
    capped = plan_memory(MODEL, 64 * GiB, kv_cap=40000)
    assert capped.kv_tokens == 40000 and capped.expert_slots == 6144


def test_a_floor_that_does_not_fit_is_a_clear_error():
    with pytest.raises(ValueError, match=r"KV floor of 262144 tokens \(24.00 GiB\).*lower --kv-floor"):
        plan_memory(MODEL, 24 * GiB, kv_floor=262144)
    # exactly enough for the floor and the 8 staging slots: fits, with 8 slots
    exact = 2 * GiB + 1000 * (96 << 10) + 8 * 9 * MiB
    assert plan_memory(MODEL, exact, kv_floor=1000).expert_slots == 8
    with pytest.raises(ValueError, match="do not fit"):
        plan_memory(MODEL, exact - 1, kv_floor=1000)


def test_default_floor_follows_a_short_model_context():
    small = ModelMemory(1 * MiB, 1024, 64 << 10, 64, 2, max_context=512)
    plan = plan_memory(small, 16 * MiB, device="cpu")
    assert plan.kv_floor == 512
    # 15 MiB - 0.5 MiB KV = 14.5 MiB of room, all 64 experts take 4 MiB; the rest is KV
    assert plan.expert_slots == 64
    assert plan.kv_tokens == 512 + (15 * MiB - 512 * 1024 - 4 * MiB) // 1024


def test_the_engine_gets_exactly_the_planned_slot_rows():
    # the demo model on a budget that holds 12 of its 16 experts: 4 policy slots + 8 staging rows (one layer),
    # and a slot pool of those rows holds exactly the planned bytes; the CPU-only engine's own pool aliases the
    # store (every expert computed from it), so it holds none
    from freetoken.engine.slots import SlotPool
    from freetoken.serve.config import ServeConfig
    from freetoken.serve.startup import load

    backend, plan = load(ServeConfig(device_budget_gb=0.0009, kv_floor=512), log=lambda s: None)
    engine = backend.engine
    pool = engine.cache.pool
    assert plan.expert_slots == 12 and plan.kv_tokens >= 512
    assert (pool.capacity, pool.staging) == (4, 8)
    assert pool.alias and pool.nbytes == 0
    real = SlotPool(pool.capacity, pool.staging, engine.store, "cpu")
    assert real.w_gate_up.shape[0] * real.w_gate_up[0].numel() * real.w_gate_up.element_size() \
        + real.w_down.numel() * real.w_down.element_size() == real.nbytes == plan.expert_bytes
