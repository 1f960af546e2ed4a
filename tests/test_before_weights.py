"""What a checkpoint's small files decide (config.json, the tokenizer, generation_config.json) is checked before
its weights load: `ft generate` and `ft serve` fail in one line naming the flag or the file, and no tensor is read.

The spy is the checkpoint reader's one way to a tensor (_Reader.get): it raises, so a check that came after the
load would surface as that AssertionError instead of the expected line (test_the_spy_sees_a_load shows it does)."""

from __future__ import annotations

import json
import shutil

import pytest

from freetoken.cli import main
from freetoken.paths import DEMO_MODEL

DEMO_CONFIG = DEMO_MODEL / "config.json"  # the demo: 2 MoE layers, context 2048
CPU = ["--kernels", "reference", "--device", "cpu"]


@pytest.fixture
def no_weights(monkeypatch):
    """Every tensor read raises (dense and expert, plain and packed go through _Reader.get)."""
    from freetoken.models import checkpoint

    def read(self, name, shape, dtype):
        raise AssertionError(f"tensor {name!r} read before the small files were checked")

    monkeypatch.setattr(checkpoint._Reader, "get", read)


def _error(capsys, *argv) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, no traceback
    return err.rstrip("\n")


def test_the_spy_sees_a_load(no_weights):
    """The control: flags that pass every check reach the weights, and the spy stops them there."""
    with pytest.raises(AssertionError, match="read before the small files were checked"):
        main(["generate", "--n-cpu-moe", "2", "--max-tokens", "1", *CPU])


@pytest.mark.parametrize("command", [["generate", *CPU], ["serve", "--port", "0"]])
@pytest.mark.parametrize("flags, got", [(["--n-cpu-moe", "3"], "3"), (["--n-cpu-moe", "-1"], "-1"),
                                        (["--policy", "static_layers", "--policy-option", "n_cpu_layers=x"], "'x'")])
def test_n_cpu_moe_beyond_the_models_moe_layers(capsys, no_weights, command, flags, got):
    line = _error(capsys, *command, *flags)
    assert line == (f"ft {command[0]}: error: --n-cpu-moe must lie in [0, 2] ({DEMO_CONFIG} has 2 MoE layers), "
                    f"got {got}")


def test_n_cpu_moe_on_a_checkpoint_without_config_json_names_the_file(capsys, no_weights, tmp_path):
    line = _error(capsys, "generate", "--model", str(tmp_path), "--n-cpu-moe", "1", *CPU)
    assert line == f"ft generate: error: {tmp_path / 'config.json'}: missing (a checkpoint directory needs config.json)"


def test_prompt_longer_than_max_context_is_found_by_the_tokenizer_alone(capsys, no_weights):
    from transformers import AutoTokenizer

    text = "the experts route every token to two of eight"
    n = len(AutoTokenizer.from_pretrained(DEMO_MODEL).encode(text, add_special_tokens=False))  # independent count
    assert n > 4
    line = _error(capsys, "generate", "--prompt", text, "--max-context", str(n), "--max-tokens", "3", *CPU)
    assert line == (f"ft generate: error: --max-context {n} is too short: the prompt's {n} tokens and --max-tokens 3 "
                    f"need a context of {n + 2}")


def test_default_context_is_read_from_config_json(capsys, no_weights):
    """No --max-context: the model's own 2048 (config.json's max_position_embeddings, under the 4096 cap)."""
    assert json.loads(DEMO_CONFIG.read_text())["max_position_embeddings"] == 2048
    line = _error(capsys, "generate", "--token-ids", "1,2", "--max-tokens", "2048", *CPU)
    assert line == ("ft generate: error: the default context of 2048 tokens (--max-context sets it) is too short: the "
                    "prompt's 2 tokens and --max-tokens 2048 need a context of 2049")


@pytest.fixture
def model_dir(tmp_path):
    out = tmp_path / "model"
    shutil.copytree(DEMO_MODEL, out)
    return out


@pytest.mark.parametrize("command", [["generate", *CPU], ["serve", "--port", "0"]])
@pytest.mark.parametrize("text, message", [
    ('{"top_p": 1.5}', "top_p must lie in (0, 1], got 1.5"),  # was worded as the --top-p flag, never given
    ('{"top_p": 0}', "top_p must lie in (0, 1], got 0.0"),
    ('{"temperature": NaN}', "temperature must be a finite number >= 0, got nan"),
    ('{"temperature": Infinity}', "temperature must be a finite number >= 0, got inf"),
    ('{"temperature": -0.5}', "temperature must be a non-negative number, got -0.5"),
    ('{"temperature": "hot"}', "temperature must be a non-negative number, got 'hot'"),
    ('{"top_k": 2.5}', "top_k must be a whole number, got 2.5"),  # was cut to 2
    ('{"top_k": Infinity}', "top_k must be a whole number, got inf"),  # was int()'s OverflowError
])
def test_bad_generation_config_names_the_file_and_field(capsys, no_weights, model_dir, command, text, message):
    (model_dir / "generation_config.json").write_text(text)
    line = _error(capsys, *command, "--model", str(model_dir))
    assert line == f"ft {command[0]}: error: {model_dir / 'generation_config.json'}: {message}"


def test_generation_config_sampling_within_range_loads(model_dir):
    """The boundaries the sampler accepts: temperature 0, top_p 1, top_k 0; a whole float top_k is an int."""
    from freetoken.models.generation_config import GenerationDefaults

    (model_dir / "generation_config.json").write_text('{"temperature": 0, "top_p": 1, "top_k": 40.0}')
    d = GenerationDefaults.load(model_dir)
    assert (d.temperature, d.top_p, d.top_k) == (0.0, 1.0, 40) and isinstance(d.top_k, int)
