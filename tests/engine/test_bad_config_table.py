"""Bad config.json / generation_config.json / quantization_config values and bad weight tensors, one row each: the
engine refuses the checkpoint with exactly one line naming the file and the field or tensor (hand-written, never
captured from a run). The base checkpoint is the tiny Qwen3-MoE (hidden 64, 4 heads of 16, 2 kv heads, 2 layers,
8 experts, top-2, vocab 128); every row changes one thing."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from freetoken.engine import Engine
from freetoken.models import CheckpointError

CFG, GEN, WEIGHTS = "config.json", "generation_config.json", "model.safetensors"
Q = "model.layers.0.self_attn.q_proj.weight"
EXPERT = "model.layers.1.mlp.experts.3.down_proj.weight"


def _set(**fields):
    return lambda c: c.update(fields)


def _drop(*names):
    return lambda c: [c.pop(n) for n in names]


def _both(*edits):
    def edit(c):
        for e in edits:
            e(c)
    return edit


# (id, file edited, edit, expected message after "<dir>/<file named>: ")
CONFIG_CASES = [
    ("eps_nan", _set(rms_norm_eps=math.nan), "field 'rms_norm_eps' must be finite, got nan"),
    ("eps_zero", _set(rms_norm_eps=0), "field 'rms_norm_eps' must be a positive number, got 0"),
    ("eps_text", _set(rms_norm_eps="1e-6"), "field 'rms_norm_eps' must be a positive number, got '1e-6'"),
    ("theta_negative", _set(rope_theta=-10000.0), "field 'rope_theta' must be a positive number, got -10000.0"),
    ("theta_inf", _set(rope_theta=math.inf), "field 'rope_theta' must be finite, got inf"),
    ("heads_zero", _set(num_attention_heads=0), "field 'num_attention_heads' must be a positive integer, got 0"),
    ("heads_zero_no_head_dim", _both(_set(num_attention_heads=0), _drop("head_dim")),
     "field 'num_attention_heads' must be a positive integer, got 0"),
    ("heads_vs_kv_heads", _set(num_attention_heads=3),
     "num_attention_heads 3 is not a multiple of num_key_value_heads 2"),
    ("hidden_vs_heads", _both(_set(num_attention_heads=5, num_key_value_heads=5), _drop("head_dim")),
     "without head_dim, hidden_size 64 must be a multiple of num_attention_heads 5"),
    ("kv_heads_zero", _set(num_key_value_heads=0), "field 'num_key_value_heads' must be a positive integer, got 0"),
    ("head_dim_negative", _set(head_dim=-16), "field 'head_dim' must be a positive integer, got -16"),
    ("vocab_zero", _set(vocab_size=0), "field 'vocab_size' must be a positive integer, got 0"),
    ("vocab_fraction", _set(vocab_size=1.5), "field 'vocab_size' must be a positive integer, got 1.5"),
    ("vocab_bool", _set(vocab_size=True), "field 'vocab_size' must be a positive integer, got True"),
    ("hidden_text", _set(hidden_size="64"), "field 'hidden_size' must be a positive integer, got '64'"),
    ("layers_zero", _set(num_hidden_layers=0), "field 'num_hidden_layers' must be a positive integer, got 0"),
    ("experts_zero", _set(num_experts=0), "field 'num_experts' must be a positive integer, got 0"),
    ("top_k_zero", _set(num_experts_per_tok=0), "field 'num_experts_per_tok' must be a positive integer, got 0"),
    ("top_k_over_experts", _set(num_experts_per_tok=9), "num_experts_per_tok 9 exceeds the 8 experts"),
    ("expert_width_negative", _set(moe_intermediate_size=-1),
     "field 'moe_intermediate_size' must be a positive integer, got -1"),
    ("dense_width_zero", _set(intermediate_size=0), "field 'intermediate_size' must be a positive integer, got 0"),
    ("context_negative", _set(max_position_embeddings=-5),
     "field 'max_position_embeddings' must be a positive integer, got -5"),
    ("context_text", _set(max_position_embeddings="4096"),
     "field 'max_position_embeddings' must be a positive integer, got '4096'"),
    ("eos_text", _set(eos_token_id="abc"), "field 'eos_token_id' must be a token id [0, 128) or a list of them, "
                                           "got 'abc'"),
    ("eos_past_vocab", _set(eos_token_id=999), "field 'eos_token_id' must be a token id [0, 128) or a list of them, "
                                               "got 999"),
    ("eos_list_negative", _set(eos_token_id=[1, -2]), "field 'eos_token_id' must be a token id [0, 128) or a list "
                                                      "of them, got [1, -2]"),
    ("bos_fraction", _set(bos_token_id=3.5), "field 'bos_token_id' must be a token id [0, 128) or a list of them, "
                                             "got 3.5"),
    ("pad_negative", _set(pad_token_id=-1), "field 'pad_token_id' must be a token id [0, 128) or a list of them, "
                                            "got -1"),
    ("tie_text", _set(tie_word_embeddings="yes"), "field 'tie_word_embeddings' must be true or false, got 'yes'"),
    ("norm_topk_int", _set(norm_topk_prob=1), "field 'norm_topk_prob' must be true or false, got 1"),
    ("dtype_unknown", _set(dtype="float33"), "field 'dtype' is 'float33', not a torch dtype name (bfloat16, float16, "
                                             "float32, ...)"),
    ("dense_layer_outside", _set(mlp_only_layers=[5]), "mlp_only_layers must list layer indices in [0, 2), got [5]"),
    ("sparse_step_zero", _set(decoder_sparse_step=0), "field 'decoder_sparse_step' must be a positive integer, got 0"),
    ("yarn_factor_negative", _set(rope_scaling={"rope_type": "yarn", "factor": -4.0,
                                                "original_max_position_embeddings": 64}),
     "field 'rope_scaling.factor' must be a positive number, got -4.0"),
    ("rope_type_unsupported", _set(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                                    "original_max_position_embeddings": 64}),
     "rope type 'yarn' is not supported (supported here: default)"),
    ("rotary_fraction", _set(partial_rotary_factor=1.5),
     "field 'partial_rotary_factor' must be a number in (0, 1], got 1.5"),
    ("any_number_nan", _set(initializer_range=math.nan), "field 'initializer_range' must be finite, got nan"),
    ("nested_nan", _set(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mscale": math.nan}),
     "field 'rope_parameters.mscale' must be finite, got nan"),
    ("missing_field", _drop("hidden_size"), "missing field 'hidden_size'"),
    ("wrong_layer_count", _set(num_hidden_layers=1),
     "num_hidden_layers is 1 but the weights hold 2 layers (tensor 'model.layers.1.input_layernorm.weight' in "
     "model.safetensors)"),
    ("scale_fmt_unknown", _set(quantization_config={"quant_method": "fp8", "weight_block_size": [16, 16],
                                                    "scale_fmt": "bogus"}),
     "quantization_config.scale_fmt = 'bogus': valid are 'float', 'ue8m0'"),
    ("expert_dtype_unknown", _set(quantization_config={"quant_method": "fp8", "weight_block_size": [16, 16],
                                                       "expert_dtype": "int2"}),
     "quantization_config.expert_dtype = 'int2': valid are 'fp8', 'fp4'"),
    ("quant_method_unknown", _set(quantization_config={"quant_method": "foo"}),
     "quantization_config.quant_method = 'foo': valid methods are ['auto-round', 'auto_round', 'awq', "
     "'compressed-tensors', 'fbgemm_fp8', 'fp8', 'gptq', 'modelopt', 'mxfp4']"),
]
GENERATION_CASES = [  # generation_config.json
    ("temperature_nan", {"temperature": math.nan}, "temperature must be a finite number >= 0, got nan"),
    ("top_p_over_one", {"top_p": 1.5}, "top_p must lie in (0, 1], got 1.5"),
    ("top_k_fraction", {"top_k": 2.5}, "top_k must be a whole number, got 2.5"),
    ("gen_eos_text", {"eos_token_id": "x"}, "eos_token_id must be token ids, got 'x'"),
    ("min_p_over_one", {"min_p": 1.5}, "min_p must lie in [0, 1], got 1.5"),
    ("repetition_penalty_zero", {"repetition_penalty": 0}, "repetition_penalty must be a finite number > 0, got 0.0"),
]
TENSOR_CASES = [  # model.safetensors: (id, tensor, its replacement from the original, expected message)
    ("int32_weight", Q, lambda t: t.to(torch.int32), f"tensor '{Q}' is int32, not a weight dtype (float32, "
                                                      "bfloat16, float16)"),
    ("nan_weights", Q, lambda t: torch.full_like(t, math.nan), f"tensor '{Q}' holds NaN values (4096 of the 4096 "
                                                                 "checked)"),
    ("inf_in_an_expert", EXPERT, lambda t: t.index_put((torch.tensor([5]), torch.tensor([7])), torch.tensor(math.inf)),
     f"tensor '{EXPERT}' holds Inf values (1 of the 2048 checked)"),
    ("fp8_without_quant_config", "model.embed_tokens.weight", lambda t: t.to(torch.float8_e4m3fn),
     "tensor 'model.embed_tokens.weight' is float8_e4m3fn, not a weight dtype (float32, bfloat16, float16, or a "
     "quantization_config for FP8)"),
    ("wrong_shape", EXPERT, lambda t: t[:-1].clone(), f"tensor '{EXPERT}' has shape [63, 32], expected [64, 32]"),
]


@pytest.fixture()
def ckpt_dir(hf_models, tmp_path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(hf_models["qwen3_moe"].path, out)
    return out


def _refused(path: Path) -> str:
    with pytest.raises(CheckpointError) as err:
        Engine.from_pretrained(path, kernels="host", device="cpu")
    message = str(err.value)
    assert "\n" not in message
    return message


def test_the_table_is_long_enough():
    assert len(CONFIG_CASES) + len(GENERATION_CASES) + len(TENSOR_CASES) >= 40


@pytest.mark.parametrize("case, edit, message", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_bad_config_value(ckpt_dir, case, edit, message):
    raw = json.loads((ckpt_dir / CFG).read_text())
    edit(raw)
    (ckpt_dir / CFG).write_text(json.dumps(raw))
    assert _refused(ckpt_dir) == f"{ckpt_dir / CFG}: {message}"


@pytest.mark.parametrize("case, fields, message", GENERATION_CASES, ids=[c[0] for c in GENERATION_CASES])
def test_bad_generation_config_value(ckpt_dir, case, fields, message):
    (ckpt_dir / GEN).write_text(json.dumps({"do_sample": True, **fields}))
    assert _refused(ckpt_dir) == f"{ckpt_dir / GEN}: {message}"


@pytest.mark.parametrize("case, name, change, message", TENSOR_CASES, ids=[c[0] for c in TENSOR_CASES])
def test_bad_tensor(ckpt_dir, case, name, change, message):
    tensors = load_file(ckpt_dir / WEIGHTS)
    tensors[name] = change(tensors[name])
    save_file(tensors, ckpt_dir / WEIGHTS, metadata={"format": "pt"})
    assert _refused(ckpt_dir) == f"{ckpt_dir / WEIGHTS}: {message}"


@pytest.mark.parametrize("command", ["generate", "predict"])
def test_the_cli_says_one_line(ckpt_dir, command, capsys):
    """num_attention_heads 0 without head_dim was a ZeroDivisionError traceback in both commands."""
    from freetoken.cli import main

    raw = json.loads((ckpt_dir / CFG).read_text())
    raw.pop("head_dim")
    (ckpt_dir / CFG).write_text(json.dumps(raw | {"num_attention_heads": 0}))
    argv = {"generate": ["generate", "--model", str(ckpt_dir), "--token-ids", "1,2", "--max-tokens", "1"],
            "predict": ["predict", "--model", str(ckpt_dir), "--hardware", "rtx5090-ryzen", "--no-band"]}[command]
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert err == (f"ft {command}: error: {ckpt_dir / CFG}: field 'num_attention_heads' must be a positive integer, "
                   "got 0")


@pytest.mark.parametrize("prompt, context, says", [
    (10**12, None, "its context of 64 tokens (config.json max_position_embeddings)"),
    (100, None, "its context of 64 tokens (config.json max_position_embeddings)"),
    (10**12, "qwen3-30b-a3b", "1,048,576 tokens (the card states no context; the longest of the shipped models)"),
])
def test_ft_predict_bounds_its_prompt_by_the_model(ckpt_dir, capsys, prompt, context, says):
    """A prompt past what the model holds is refused before any trace is drawn (1e12 tokens was killed for memory
    after 40 s): the checkpoint's max_position_embeddings, or for a card that states no context, 2^20 tokens."""
    from freetoken.cli import main

    raw = json.loads((ckpt_dir / CFG).read_text())
    (ckpt_dir / CFG).write_text(json.dumps(raw | {"max_position_embeddings": 64}))
    model = context or str(ckpt_dir)
    name = context or ckpt_dir.name
    assert main(["predict", "--model", model, "--hardware", "rtx5090-ryzen", "--prompt-tokens", str(prompt),
                 "--decode-tokens", "8", "--no-band"]) != 0
    total = prompt + 8
    assert capsys.readouterr().err.strip() == (f"ft predict: error: --prompt-tokens {prompt:,} + --decode-tokens 8 = "
                                               f"{total:,} tokens: more than model {name} can hold, {says}")
