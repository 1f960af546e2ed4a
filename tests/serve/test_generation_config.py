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


def test_repetition_penalty_and_min_p_defaults_as_hf_and_vllm_take_them(model_dir):
    """generation_config.json's repetition_penalty: ft generate (unset flag) gives HF generate's penalized greedy
    tokens, different from plain greedy; the flag overrides it; min_p reaches the sampling; bad values name the
    file and field."""
    from transformers import AutoModelForCausalLM

    from freetoken.cli import main
    from freetoken.engine.sampling import load_generation_defaults, sampling_params
    from freetoken.models.config import CheckpointError

    prompt = [5, 9, 14, 20, 9, 14]

    def generate(*flags) -> list[int]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            assert main(["generate", "--model", str(model_dir), "--token-ids", ",".join(map(str, prompt)),
                         "--max-tokens", "10", "--kernels", "reference", "--device", "cpu", "--stop-token-ids", "",
                         "--json", *flags]) == 0
        return json.loads(out.getvalue())["token_ids"]

    (model_dir / "generation_config.json").write_text(json.dumps(
        {"do_sample": False, "repetition_penalty": 0.4, "min_p": 0.05}))  # < 1: seen tokens favoured
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=10, min_new_tokens=10)[0, len(prompt):].tolist()
    plain = generate("--repetition-penalty", "1")
    assert generate() == ref != plain
    d = load_generation_defaults(model_dir)
    s = sampling_params(d)
    assert (s.repetition_penalty, s.min_p) == (0.4, 0.05)
    s = sampling_params(d, min_p=0.0, repetition_penalty=1.2)
    assert (s.repetition_penalty, s.min_p) == (1.2, 0.0)
    for bad in ({"repetition_penalty": 0}, {"min_p": 2}):
        (model_dir / "generation_config.json").write_text(json.dumps(bad))
        with pytest.raises(CheckpointError, match=f"generation_config.json: {next(iter(bad))}"):
            load_generation_defaults(model_dir)
    (model_dir / "generation_config.json").unlink()


def test_generate_logit_bias_is_hf_generates_sequence_bias(model_dir):
    """ft generate --logit-bias against HF generate's sequence_bias (one-token sequences) on the same greedy run:
    plain greedy's second token banned, another token favoured; the output differs from plain greedy."""
    from transformers import AutoModelForCausalLM

    from freetoken.cli import main

    prompt = [5, 9, 14, 20]

    def generate(*flags) -> list[int]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            assert main(["generate", "--model", str(model_dir), "--token-ids", ",".join(map(str, prompt)),
                         "--max-tokens", "8", "--kernels", "reference", "--device", "cpu", "--stop-token-ids", "",
                         "--greedy", "--json", *flags]) == 0
        return json.loads(out.getvalue())["token_ids"]

    plain = generate()
    bias = {plain[1]: -100.0, 7: 4.0}
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                          sequence_bias={(t,): b for t, b in bias.items()})[0, len(prompt):].tolist()
    got = generate("--logit-bias", ",".join(f"{t}={b}" for t, b in bias.items()))
    assert got == ref != plain and plain[1] not in got


def test_the_server_takes_unset_penalty_and_min_p_from_generation_config():
    """A request that leaves repetition_penalty / min_p unset gets the model's defaults (vLLM's
    --generation-config auto); one that sets them, its own."""
    from types import SimpleNamespace

    from freetoken.serve.chat import Params
    from freetoken.serve.decoding import make_decoder

    backend = SimpleNamespace(vocab_size=100, stop_token_ids=[0], chat=SimpleNamespace(encode=lambda text: [1]),
                              generation_defaults=GenerationDefaults(min_p=0.1, repetition_penalty=1.3))
    unset = make_decoder(backend, None, Params(), [4, 5])
    assert (unset.params.min_p, unset.params.repetition_penalty) == (0.1, 1.3)
    assert (unset.sampling.min_p, unset.sampling.repetition_penalty) == (0.0, 1.0)  # applied once, in shape()
    assert unset.prompt_ids.tolist() == [4, 5]
    given = make_decoder(backend, None, Params(min_p=0.0, repetition_penalty=1.0), [4, 5])
    assert (given.params.min_p, given.params.repetition_penalty) == (0.0, 1.0)
    assert given.prompt_ids.tolist() == []
