"""`ft predict` and the live engine agree on a quantized checkpoint's capacity.

For a tiny random Qwen3-MoE whose experts were written by each format's independent packer in its real checkpoint
layout (tests/quant/packers.py), the sim's side (a card from config.json alone -> sim.planner.model_memory ->
plan_memory -> policy_capacity) must equal the engine's (the loaded checkpoint's ExpertStore, checkpoint_memory,
the server's start-up plan and the slot pool it allocates) for one memory budget: bytes per expert, slots, KV
tokens, the policy / staging split and the pool's bytes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "quant"), str(HERE / "serve")]  # the packers and the tiny serve model (no packages)
import packers
from tinymodel import CHARS, SPECIALS, write_tiny_model

from freetoken.placement.memory import GiB, cache_rows, plan_memory

E, I, D, LAYERS = 8, 32, 64, 2
FLOOR = 256  # KV tokens
TARGET_SLOTS = 12.5  # budget sized for ~12 of the 16 experts: 4 policy slots + 8 staging rows
IGNORE_CT = {"ignore": ["lm_head", "re:.*mlp.gate$"]}

# name -> (quantization_config, packer (prefix, w [out, in]) -> (tensors, w'), attention quantized too)
FORMATS = {
    "gptq": (packers.gptq_config(32, True) | {"modules_to_not_convert": ["gate", "lm_head"]},
             lambda p, w: packers.gptq_auto_round(p, w, 32, True), True),
    "gptq_act_order": (packers.CONFIGS["gptq_act_order"](32, True),
                       lambda p, w: packers.gptq_act_order(p, w, 32, True), False),
    "awq": (packers.CONFIGS["awq"](32), lambda p, w: packers.awq_auto_round(p, w, 32), False),
    "fp8_block_ue8m0": (packers.CONFIGS["fp8_block"]((32, 32), "ue8m0"),
                        lambda p, w: packers.fp8_block_transformers(p, w, (32, 32), "ue8m0"), False),
    "fp8_channel": (packers.CONFIGS["fp8_channel"]() | IGNORE_CT, packers.fp8_channel_ct, False),
    "nvfp4": (packers.CONFIGS["nvfp4_ct"]() | IGNORE_CT, packers.nvfp4_ct, False),
    "mxfp4": (packers.CONFIGS["mxfp4"](), None, False),
}


def build(name: str, out: Path) -> Path:
    """The tiny serve model's tokenizer, a D 64 / I 32 / 8-expert model, its experts repacked by `name`'s packer."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config, pack, attention = FORMATS[name]
    write_tiny_model(out)  # tokenizer files; the model is replaced below
    cfg = AutoConfig.for_model("qwen3_moe", vocab_size=len(SPECIALS) + len(CHARS), hidden_size=D,
                               intermediate_size=48, moe_intermediate_size=I, num_hidden_layers=LAYERS,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=E,
                               num_experts_per_tok=2, max_position_embeddings=1024, eos_token_id=2, pad_token_id=0,
                               tie_word_embeddings=False)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    tensors = load_file(out / "model.safetensors")
    for l in range(LAYERS):
        m = f"model.layers.{l}.mlp.experts."
        if pack is None:  # gpt-oss: one fused tensor per projection, gate and up rows interleaved
            gate = torch.stack([tensors.pop(f"{m}{e}.gate_proj.weight") for e in range(E)])
            up = torch.stack([tensors.pop(f"{m}{e}.up_proj.weight") for e in range(E)])
            down = torch.stack([tensors.pop(f"{m}{e}.down_proj.weight") for e in range(E)])
            tensors |= packers.mxfp4_gpt_oss(m + "gate_up_proj", torch.stack([gate, up], 2).reshape(E, 2 * I, D))[0]
            tensors |= packers.mxfp4_gpt_oss(m + "down_proj", down)[0]
            continue
        prefixes = [f"{m}{e}.{p}" for e in range(E) for p in ("gate_proj", "up_proj", "down_proj")]
        if attention:
            prefixes += [f"model.layers.{l}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
        for prefix in prefixes:
            tensors |= pack(prefix, tensors.pop(f"{prefix}.weight"))[0]
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    raw = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(raw | {"quantization_config": config}))
    return out


def budget_for(card) -> int:
    """Bytes that leave room for about TARGET_SLOTS experts after the start-up reserve (a tenth), dense, KV floor."""
    need = card.dense_bytes() + card.embedding_bytes() + FLOOR * card.kv_bytes_per_token
    return int((need + TARGET_SLOTS * card.expert_bytes()) / 0.9)


@pytest.mark.parametrize("name", list(FORMATS))
def test_sim_and_engine_agree_on_capacity(name, tmp_path):
    from freetoken.serve.config import ServeConfig
    from freetoken.serve.startup import load
    from freetoken.sim.model_card import load_model_card
    from freetoken.sim.planner import model_memory, policy_capacity

    path = build(name, tmp_path / name)
    card = load_model_card(str(path))  # from config.json alone
    gb = budget_for(card) / GiB
    backend, plan = load(ServeConfig(model=path, device_budget_gb=gb, kv_floor=FLOOR), log=lambda s: None)
    budget = int(gb * GiB)  # what start-up planned against

    store, pool = backend.engine.store, backend.engine.cache.pool
    assert store.packed and card.expert_bytes() == store.expert_bytes
    engine_memory, sim_memory = backend.model_memory(), model_memory(card)
    for field in ("dense_bytes", "kv_bytes_per_token", "expert_bytes", "num_experts", "min_slots"):
        assert getattr(sim_memory, field) == getattr(engine_memory, field), field
    sim_plan = plan_memory(sim_memory, budget, kv_floor=FLOOR, reserve_bytes=min(GiB, budget // 10))
    assert {k: v for k, v in sim_plan.to_dict().items() if k != "device"} == \
        {k: v for k, v in plan.to_dict().items() if k != "device"}
    # a partly resident cache: some policy slots, one layer (8 experts) of staging, not every expert
    assert 0 < pool.capacity and plan.expert_slots < LAYERS * E
    assert (policy_capacity(sim_plan, card), cache_rows(sim_plan, card.num_experts)[1]) == (pool.capacity,
                                                                                             pool.staging) \
        and pool.staging == E
    # the CPU engine's pool aliases the store (no rows); a pool of the planned rows holds exactly the planned bytes
    from freetoken.engine.slots import SlotPool

    real = SlotPool(pool.capacity, pool.staging, store, "cpu")
    assert pool.alias and pool.nbytes == 0
    assert real.nbytes == plan.expert_bytes == plan.expert_slots * card.expert_bytes()


def test_gptq_expert_bytes_by_hand(tmp_path):
    from freetoken.models.checkpoint import load_checkpoint
    from freetoken.serve.engine_backend import checkpoint_memory
    from freetoken.sim.model_card import load_model_card

    path = build("gptq", tmp_path / "gptq")
    # gate, up [32, 64], g32: 1,024 B of nibbles + 32 rows x 2 groups x (2 B fp16 scale + 1 B uint8 zero) = 1,216;
    # down [64, 32]: 1,024 + 64 x 1 x 3 = 1,216. Expert: 3,648 B (the checkpoint's int32 zeros would hold 3 x 1,184)
    assert load_model_card(str(path)).expert_bytes() == 3_648
    assert checkpoint_memory(load_checkpoint(path), 1024).expert_bytes == 3_648
