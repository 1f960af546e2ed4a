"""Model cards with a packed expert format (by name, from YAML, from a checkpoint's config.json), and the planner's
staging rows: one layer's experts, as the engine keeps them."""

import json

import pytest

from freetoken.cli import main
from freetoken.sim.hardware import load_hardware
from freetoken.sim.model_card import QUANT_BITS, load_model_card
from freetoken.sim.planner import model_memory, plan_for, policy_capacity


def test_named_formats_size_the_experts_exactly():
    card = load_model_card("qwen3-30b-a3b")  # expert: gate, up [768, 2048], down [2048, 768]
    gptq = card.with_quant("gptq-g128")
    # tests/quant/test_packed_bytes.py derives it: 3 x (786,432 data + 24,576 fp16 scales + 12,288 uint8 zeros)
    assert gptq.expert_bytes() == 2_469_888 and gptq.expert_bits == 2_469_888 * 8 / 4_718_592
    # fp8 block 128x128: 3 x (1,572,864 + 6 x 16 fp32 scales)
    assert card.with_quant("fp8-block").expert_bytes() == 3 * (1_572_864 + 96 * 4)
    # nvfp4: 3 x (786,432 + 98,304 e4m3 scales + 4 B global scale)
    assert card.with_quant("nvfp4").expert_bytes() == 3 * (786_432 + 98_304 + 4)
    # bits names keep their numbers: 4,718,592 params x 4.25 / 8, x 4.85 / 8
    assert card.with_quant("int4").expert_bytes() == 2_506_752
    assert card.with_quant("q4_k_m").expert_bytes() == 2_860_646 and QUANT_BITS["q4_k_m"] == 4.85
    # a bits name after a format clears the format
    assert gptq.with_quant("int4").expert_format is None and gptq.with_quant("int4").expert_bytes() == 2_506_752
    with pytest.raises(ValueError, match=r"unknown expert quantization 'int3'; valid formats: gptq-g32.*nvfp4; "
                                         r"bits per weight: bf16.*q4_k_m"):
        card.with_quant("int3")


def test_yaml_card_names_its_expert_format(tmp_path):
    import yaml

    from freetoken.sim.model_card import MODEL_DIR

    data = yaml.safe_load((MODEL_DIR / "qwen3-30b-a3b.yaml").read_text()) | {"expert_format": "awq-g128"}
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_model_card(str(path)).expert_bytes() == 2_469_888  # awq and gptq pack alike
    path.write_text(yaml.safe_dump(data | {"expert_format": "gptq-g48"}))
    with pytest.raises(ValueError, match=r"q.yaml: unknown expert format 'gptq-g48'; valid: gptq-g32"):
        load_model_card(str(path))


def _write_config(path, **extra):
    path.mkdir()
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 1000,
           "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 64, "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 128,
           "intermediate_size": 512, "max_position_embeddings": 4096, "tie_word_embeddings": False,
           "dtype": "bfloat16"} | extra
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def test_card_from_a_checkpoint_config(tmp_path):
    q = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "checkpoint_format": "gptq"}
    card = load_model_card(str(_write_config(tmp_path / "ck", quantization_config=q)))
    assert (card.name, card.moe_layers, card.num_experts, card.top_k) == ("ck", 4, 16, 4)
    # per layer: q 256x256, k, v 128x256, o 256x256, router 16x256, norms 256 x 2, q/k norms 64 x 2;
    # plus lm_head 1000x256 and the final norm; embedding 1000x256 apart
    layer = 256 * 256 * 2 + 128 * 256 * 2 + 16 * 256 + 256 * 2 + 64 * 2
    assert card.dense_params * 1e9 == pytest.approx(4 * layer + 1000 * 256 + 256, abs=1e-3)
    assert card.embedding_params * 1e9 == pytest.approx(1000 * 256, abs=1e-3)
    assert card.kv_bytes_per_token == 2 * 4 * 2 * 64 * 2
    # gate/up [128, 256]: 16,384 data + 128 x 2 x (2 + 1); down [256, 128]: 16,384 + 256 x 1 x 3
    assert card.expert_bytes() == 2 * (16_384 + 768) + 16_384 + 768
    assert "gptq int4 g128" in card.source


def test_predict_on_a_checkpoint_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ck = _write_config(tmp_path / "ck", quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]})
    assert main(["predict", "--model", str(ck), "--hardware", "rtx4060-laptop", "--prompt-tokens", "32",
                 "--decode-tokens", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["capacity_experts"] == 64 and out["total_experts"] == 64  # everything fits in 8 GiB
    assert out["inputs"]["expert_bytes"] == 3 * (256 * 128 + 2 * 1 * 4)  # fp8 + one scale per 128x128 block
    # --expert-format resizes a card's experts by name
    assert main(["predict", "--model", "qwen3-30b-a3b", "--hardware", "rtx4060-laptop", "--expert-format",
                 "gptq-g128", "--prompt-tokens", "32", "--decode-tokens", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["expert_bytes"] == 2_469_888
    for bad, message in ((tmp_path / "nothing-here", "no such checkpoint directory or .yaml model card"),
                         (tmp_path / "cache", "config.json: missing")):
        assert main(["predict", "--model", str(bad), "--hardware", "h200"]) == 2
        err = capsys.readouterr().err
        assert message in err and str(bad) in err and len(err.strip().splitlines()) == 1


def test_planner_keeps_one_layer_of_staging_like_the_engine():
    # the engine's slot pool: policy slots + one layer's experts of staging (serve/engine_backend.py use_plan)
    card, hw = load_model_card("qwen3.5-122b-a10b"), load_hardware("rtx5090-ryzen")
    assert model_memory(card).min_slots == card.num_experts == 256
    plan = plan_for(card, hw)
    assert policy_capacity(plan, card) == plan.expert_slots - 256
    resident = plan_for(card, load_hardware("h200"))
    assert resident.expert_slots == card.num_keys and policy_capacity(resident, card) == card.num_keys
