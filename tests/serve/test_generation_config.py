"""generation_config.json as HF reads it: the engine stops at its eos ids where HF generate stops, and its sampling
defaults apply where a request or flag leaves them unset."""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest
import torch
from conftest import reference_engine

from freetoken.models.generation_config import GenerationDefaults


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gencfg") / "tiny"
    shutil.copytree(tiny_model_dir, out)
    return out


def test_engine_stops_at_generation_config_eos_as_hf_generate(model_dir):
    from transformers import AutoModelForCausalLM

    from freetoken.engine import SamplingParams

    prompt = [5, 9, 14, 20]
    engine = reference_engine(model_dir, device="cpu")
    free = list(engine.generate(prompt, SamplingParams(greedy=True), max_tokens=12, stop_token_ids=[]))
    stop = free[3]  # a token greedy reaches at step 4; config.json does not list it
    assert stop not in engine.default_stop_ids() and stop not in free[:3]
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [stop], "do_sample": False}))
    engine = reference_engine(model_dir, device="cpu")
    ours = list(engine.generate(prompt, SamplingParams(greedy=True), max_tokens=12))
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12)[0, len(prompt):].tolist()
    assert ours == ref == free[:4]


def test_sampling_defaults_fill_what_is_unset(model_dir, tmp_path):
    from freetoken.cli import main

    (model_dir / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.9, "top_k": 20}))
    from freetoken.engine.sampling import sampling_params

    d = GenerationDefaults.load(model_dir)
    s = sampling_params(d)
    assert (s.temperature, s.top_p, s.top_k) == (0.6, 0.9, 20)
    s = sampling_params(d, temperature=1.2, top_k=0)
    assert (s.temperature, s.top_p, s.top_k) == (1.2, 0.9, 0)
    assert sampling_params(GenerationDefaults.load(tmp_path)).temperature == 1.0  # no file: the usual defaults

    def generate(*flags) -> list[int]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            assert main(["generate", "--model", str(model_dir), "--token-ids", "5,9,14", "--max-tokens", "6",
                         "--kernels", "reference", "--device", "cpu", "--json", *flags]) == 0
        return json.loads(out.getvalue())["token_ids"]

    (model_dir / "generation_config.json").write_text(json.dumps({"do_sample": False}))  # HF: greedy
    assert generate() == generate("--greedy")
    (model_dir / "generation_config.json").write_text('{"temperature": "hot"}')
    with pytest.raises(ValueError, match="temperature"):
        GenerationDefaults.load(model_dir)
