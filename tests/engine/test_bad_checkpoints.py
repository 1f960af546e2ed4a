"""Bad checkpoints fail with one clear error naming the file and the tensor or field; nothing half-loaded is used."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from freetoken.engine import Engine
from freetoken.models import CheckpointError
from freetoken.models.checkpoint import load_checkpoint


@pytest.fixture()
def ckpt_dir(hf_models, tmp_path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(hf_models["qwen3_moe"].path, out)
    return out


def shard(ckpt_dir: Path, names_per_shard: int = 20) -> list[Path]:
    """Rewrite the single file as an indexed multi-shard checkpoint (as save_pretrained does for big models)."""
    tensors = load_file(ckpt_dir / "model.safetensors")
    (ckpt_dir / "model.safetensors").unlink()
    names = sorted(tensors)
    files, weight_map = [], {}
    for i in range(0, len(names), names_per_shard):
        file = ckpt_dir / f"model-{i // names_per_shard + 1:05d}.safetensors"
        save_file({n: tensors[n] for n in names[i:i + names_per_shard]}, file, metadata={"format": "pt"})
        weight_map.update({n: file.name for n in names[i:i + names_per_shard]})
        files.append(file)
    (ckpt_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return files


def test_sharded_checkpoint_loads_same_tensors(ckpt_dir, checkpoints):
    files = shard(ckpt_dir)
    assert len(files) > 2
    got, want = load_checkpoint(ckpt_dir), checkpoints["qwen3_moe"]
    assert set(got.dense) == set(want.dense)
    for name in want.dense:
        torch.testing.assert_close(got.dense[name], want.dense[name], rtol=0, atol=0)
    for (g1, d1), (g2, d2) in zip(got.experts, want.experts):
        torch.testing.assert_close(g1, g2, rtol=0, atol=0)
        torch.testing.assert_close(d1, d2, rtol=0, atol=0)


def test_missing_shard(ckpt_dir):
    files = shard(ckpt_dir)
    files[1].unlink()
    with pytest.raises(CheckpointError, match=rf"{files[1].name}: shard missing .*tensor 'model\."):
        Engine.from_pretrained(ckpt_dir, device="cpu")


def test_truncated_safetensors(ckpt_dir):
    file = ckpt_dir / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: unreadable or truncated"):
        load_checkpoint(ckpt_dir)


def test_tensor_of_wrong_shape(ckpt_dir):
    file = ckpt_dir / "model.safetensors"
    tensors = load_file(file)
    name = "model.layers.1.mlp.experts.3.up_proj.weight"
    tensors[name] = tensors[name][:-1].clone()  # [31, 64] instead of [32, 64]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: tensor '{name}' has shape \[31, 64\], "
                                              r"expected \[32, 64\]"):
        load_checkpoint(ckpt_dir)


def test_missing_tensor(ckpt_dir):
    file = ckpt_dir / "model.safetensors"
    tensors = load_file(file)
    del tensors["model.layers.0.self_attn.k_norm.weight"]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"tensor 'model\.layers\.0\.self_attn\.k_norm\.weight' not found"):
        load_checkpoint(ckpt_dir)


def test_unknown_architecture(ckpt_dir):
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config\.json: unknown architecture LlamaForCausalLM; supported: "
                                              r"DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, DeepseekV4ForCausalLM, "
                                              r"Glm4MoeForCausalLM, "
                                              r"GlmMoeDsaForCausalLM, GptOssForCausalLM, MiniMaxM2ForCausalLM, "
                                              r"MixtralForCausalLM, OlmoeForCausalLM, "
                                              r"Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, Qwen3NextForCausalLM, "
                                              r"Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration$"):
        load_checkpoint(ckpt_dir)


@pytest.mark.parametrize("field", ["hidden_size", "num_experts_per_tok", "moe_intermediate_size"])
def test_config_missing_a_field(ckpt_dir, field):
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    del cfg[field]
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=rf"config\.json: missing field '{field}'"):
        load_checkpoint(ckpt_dir)


@pytest.mark.parametrize("field, value, message", [
    ("num_experts", 0, "field 'num_experts' must be a positive integer, got 0"),
    ("num_experts_per_tok", 100, "num_experts_per_tok 100 exceeds the 8 experts"),
])
def test_config_value_out_of_range_names_the_checkpoints_file(ckpt_dir, field, value, message):
    """Was a bare "config.json: ...": which checkpoint's (a server or a sweep loads several) went unsaid."""
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    cfg[field] = value
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(ckpt_dir)
    assert str(err.value) == f"{ckpt_dir / 'config.json'}: {message}"


def test_hub_id_fails_offline():
    with pytest.raises(CheckpointError, match=r"Qwen/Qwen3-30B-A3B: no such local directory, and hub ids cannot "
                                              r"be loaded offline"):
        load_checkpoint("Qwen/Qwen3-30B-A3B")


def test_cli_reports_one_line(ckpt_dir, capsys):
    from freetoken.cli import main

    (ckpt_dir / "model.safetensors").write_bytes(b"\x00" * 5)
    assert main(["generate", "--model", str(ckpt_dir), "--token-ids", "1,2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.safetensors: unreadable or truncated" in err[0]


def test_config_with_fewer_layers_than_the_weights_is_named(ckpt_dir, capsys):
    """Before, num_hidden_layers 1 over 2 layers of weights loaded silently as a 1-layer model."""
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2
    cfg["num_hidden_layers"] = 1
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))
    want = (f"{ckpt_dir / 'config.json'}: num_hidden_layers is 1 but the weights hold 2 layers "
            f"(tensor 'model.layers.1.")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(ckpt_dir)
    assert str(e.value).startswith(want) and str(e.value).endswith("in model.safetensors)")
    from freetoken.cli import main

    assert main(["generate", "--model", str(ckpt_dir), "--token-ids", "1,2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "num_hidden_layers is 1 but the weights hold 2 layers" in err[0]


@pytest.mark.parametrize("field, value", [("dtype", "float99"), ("torch_dtype", "float99"), ("dtype", 16)])
def test_config_dtype_that_is_not_a_torch_dtype_is_named(ckpt_dir, field, value):
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    cfg.pop("dtype", None), cfg.pop("torch_dtype", None)
    cfg[field] = value
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=rf"config\.json: field '{field}' is {value!r}, not a torch dtype name"):
        load_checkpoint(ckpt_dir)


def test_mtp_layers_after_the_last_one_are_allowed(ckpt_dir):
    """DeepSeek-V3 checkpoints hold num_nextn_predict_layers extra layers after the last decoder layer."""
    from freetoken.models.checkpoint import check_layer_count, read_config

    _, cfg = read_config(ckpt_dir)
    where = {"model.layers.0.x": ckpt_dir / "a.safetensors",
             "model.layers.2.eh_proj.weight": ckpt_dir / "b.safetensors"}
    with pytest.raises(CheckpointError, match=r"the weights hold 3 layers \(tensor 'model\.layers\.2\.eh_proj"):
        check_layer_count(ckpt_dir, cfg, where)
    raw = json.loads((ckpt_dir / "config.json").read_text())
    raw["num_nextn_predict_layers"] = 1
    (ckpt_dir / "config.json").write_text(json.dumps(raw))
    check_layer_count(ckpt_dir, cfg, where)
