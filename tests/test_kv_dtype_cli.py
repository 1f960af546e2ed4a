"""--kv-dtype on ft predict / ft generate and the engine config: fp8 KV bytes counted by hand, more expert slots in
the plan, one-line errors for a bad value."""

import json

import pytest
import torch

from freetoken.cli import main
from freetoken.sim.hardware import load_hardware
from freetoken.sim.model_card import load_model_card
from freetoken.sim.planner import plan_for, policy_capacity


def test_card_fp8_kv_bytes_by_hand():
    """Qwen3-30B-A3B: 48 layers x 4 kv heads x (K, V) x (128 codes + a 4-byte scale) = 50,688 (bf16: 98,304);
    gpt-oss-120b: 18 full-attention layers x 8 kv heads x 2 x (64 + 4) = 19,584 (bf16: 36,864)."""
    qwen, oss = load_model_card("qwen3-30b-a3b"), load_model_card("gpt-oss-120b")
    assert qwen.with_kv("fp8").kv_bytes_per_token == 48 * 4 * 2 * (128 + 4) == 50_688
    assert oss.with_kv("fp8").kv_bytes_per_token == 18 * 8 * 2 * (64 + 4) == 19_584
    assert qwen.with_kv("bf16").kv_bytes_per_token == qwen.with_kv("auto").kv_bytes_per_token == 98_304


def test_predict_and_serve_count_a_checkpoint_kv_alike():
    """The demo checkpoint (fp32, 2 layers x 2 kv heads x 16 dims): its card through ft predict's planner input and
    the engine's own checkpoint_memory agree: 512 / 256 / 160 bytes per token for auto / bf16 / fp8."""
    from freetoken.models.checkpoint import load_checkpoint
    from freetoken.paths import DEMO_MODEL
    from freetoken.serve.engine_backend import checkpoint_memory
    from freetoken.sim.checkpoint_card import card_from_checkpoint
    from freetoken.sim.planner import model_memory

    card, ckpt = card_from_checkpoint(DEMO_MODEL), load_checkpoint(DEMO_MODEL)
    for kv_dtype, want in (("auto", 512), ("bf16", 256), ("fp8", 2 * 2 * 2 * (16 + 4))):
        assert model_memory(card.with_kv(kv_dtype)).kv_bytes_per_token == want
        assert checkpoint_memory(ckpt, 64, kv_dtype).kv_bytes_per_token == want


def test_fp8_kv_plan_fits_more_expert_slots_by_hand():
    """RTX 4060 laptop, 8 GiB: 8,589,934,592 - 1 GiB reserve - dense 2,460,000,000 - embedding 622,000,000 =
    4,434,192,768 bytes. bf16 KV floor 32,768 x 98,304 = 3,221,225,472 leaves 1,212,967,296 = 128 experts of
    9,437,184 (all staging: 0 policy slots); fp8 floor 32,768 x 50,688 = 1,660,944,384 leaves 2,773,248,384 =
    293 experts (165 policy slots after one layer's 128 staging rows)."""
    card, hw = load_model_card("qwen3-30b-a3b"), load_hardware("rtx4060-laptop")
    bf16, fp8 = plan_for(card.with_kv("bf16"), hw, 32768), plan_for(card.with_kv("fp8"), hw, 32768)
    assert (bf16.expert_slots, fp8.expert_slots) == (128, 293)
    assert (policy_capacity(bf16, card), policy_capacity(fp8, card)) == (0, 165)
    assert fp8.kv_bytes == fp8.kv_tokens * 50_688


def test_ft_predict_shows_the_fp8_kv_cache(capsys):
    args = ["predict", "--model", "qwen3-30b-a3b", "--hardware", "rtx4060-laptop", "--prompt-tokens", "64",
            "--decode-tokens", "8", "--no-band", "--kv-floor", "32768", "--kv-dtype", "fp8"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "capacity 165 of 6144 experts" in out and "KV cache fp8: 50688 bytes per token" in out
    assert main(args + ["--json"]) == 0
    inputs = json.loads(capsys.readouterr().out)["inputs"]
    assert (inputs["kv_dtype"], inputs["kv_bytes_per_token"]) == ("fp8", 50_688)
    assert inputs["engine_settings"]["kv_dtype"] == "fp8"


@pytest.mark.parametrize("command", [["predict", "--model", "qwen3-30b-a3b", "--hardware", "h200"],
                                     ["generate", "--max-tokens", "1"],
                                     ["serve", "--port", "0"]])
def test_bad_kv_dtype_is_a_one_line_error(command, capsys):
    assert main([*command, "--kv-dtype", "fp4"]) == 2
    err = capsys.readouterr().err
    assert err == f"ft {command[0]}: error: --kv-dtype: 'fp4' is not one of auto, bf16, fp8\n"


def test_engine_config_validates_kv_dtype_once():
    from freetoken.experiments.specs import EngineSpec
    from freetoken.serve.config import ServeConfig

    assert EngineSpec("freetoken-offload", kv_dtype="fp8").engine().kv_dtype == "fp8"
    with pytest.raises(ValueError, match="^engine: kv_dtype: 'e5m2' is not one of auto, bf16, fp8$"):
        EngineSpec("freetoken-offload", kv_dtype="e5m2")
    with pytest.raises(ValueError, match="^--kv-dtype fp8 applies to the engine backend"):
        ServeConfig(backend="hf", kv_dtype="fp8")


def test_ft_generate_fp8_kv_equals_the_engine(capsys):
    """ft generate --kv-dtype fp8 on the demo model: the greedy tokens of an Engine with an fp8 cache."""
    from freetoken.engine import Engine, SamplingParams
    from freetoken.paths import DEMO_MODEL

    assert main(["generate", "--token-ids", "1,2,3", "--max-tokens", "6", "--greedy", "--kv-dtype", "fp8",
                 "--kernels", "reference", "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    engine = Engine.from_pretrained(DEMO_MODEL, kernels="reference", device="cpu", kv_dtype="fp8")
    assert isinstance(engine.new_kv(8).k[0], torch.Tensor) and engine.new_kv(8).k[0].dtype == torch.uint8
    want = list(engine.generate([1, 2, 3], SamplingParams(greedy=True), max_tokens=6))
    assert out["kv_dtype"] == "fp8" and out["token_ids"] == want
