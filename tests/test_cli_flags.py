"""The one flag vocabulary of ft sim / generate / serve / predict: llama.cpp spellings mean the same policy, a flag
the chosen policy or split does not read is an error naming it, no abbreviations."""

from __future__ import annotations

import json

import pytest

from freetoken.cli import main
from freetoken.paths import DEFAULT_TRACE, DEMO_MODEL


def _json(capsys, *argv) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def _error(capsys, *argv) -> str:
    assert main(list(argv)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_cpu_moe_flags_are_static_layers_on_the_cpu_lane(capsys):
    """--cpu-moe = static_layers with every MoE layer on the CPU, split cpu; --n-cpu-moe N = N layers; the old
    --n-cpu-layers spelling is the same flag. Reference: the long-hand policy / split flags."""
    trace = ["sim", "--trace", str(DEFAULT_TRACE), "--json"]  # 32 MoE layers x 8 experts
    every = _json(capsys, *trace, "--cpu-moe")
    assert every == _json(capsys, *trace, "--policy", "static_layers", "--n-cpu-moe", "32", "--split", "cpu",
                          "--capacity", "0")
    assert every["policy"] == "static_layers" and every["split"] == "cpu" and every["hits"] == 0
    assert every["cpu"] == every["misses"] > 0 and every["fetched"] == 0
    half = _json(capsys, *trace, "--n-cpu-moe", "16")
    assert half == _json(capsys, *trace, "--policy", "static_layers", "--n-cpu-layers", "16", "--split", "cpu",
                         "--capacity", "256")
    assert 0 < half["hits"] and half["misses"] < every["misses"]


def test_policy_option_reaches_the_policy(capsys):
    trace = ["sim", "--trace", str(DEFAULT_TRACE), "--json", "--fraction", "0.25", "--policy", "layer_sweep"]
    default = _json(capsys, *trace)
    assert _json(capsys, *trace, "--policy-option", "decay=0.9") == default  # its default, spelled out
    assert _json(capsys, *trace, "--policy-option", "bypass=false") != default


@pytest.mark.parametrize("argv, message", [
    (["sim", "--policy", "lru", "--n-cpu-moe", "2"], "--n-cpu-moe does nothing for --policy lru"),
    (["sim", "--cpu-moe", "--policy", "frequency"], "--cpu-moe does nothing for --policy frequency"),
    (["sim", "--policy", "s3fifo", "--scope", "global"], "--scope does nothing for --policy s3fifo"),
    (["sim", "--bh", "5", "--split", "cpu"], "--bh does nothing for --split cpu (hybrid only)"),
    (["sim", "--rule", "paper"], "--rule does nothing for --split offload (hybrid only)"),
    (["sim", "--policy", "s3fifo", "--profile-trace", str(DEFAULT_TRACE)],
     "--profile-trace: only a policy with a profile (frequency, ktransformers_dynamic, lru, moe_infinity)"),
    (["sim", "--future-trace", str(DEFAULT_TRACE)], "--future-trace: lru does not read the future"),
    (["sim", "--policy-option", "decay"], "--policy-option 'decay': expected KEY=VALUE"),
    (["sim", "--policy-option", "small=0.2"], "--policy-option: lru takes no option small; it takes: scope, split"),
    (["sim", "--policy", "s3fifo", "--policy-option", "small=abc"],
     "--policy-option: s3fifo option small must be a number, got 'abc'"),
    (["sim", "--policy", "lookahead", "--policy-option", "seed=x"],
     "--policy-option: lookahead option seed must be a whole number, got 'x'"),
    (["sim", "--policy", "lookahead", "--policy-option", "depth=1.5"],
     "--policy-option: lookahead option depth must be a whole number, got 1.5"),
    (["sim", "--policy", "layer_sweep", "--policy-option", "bypass=maybe"],
     "--policy-option: layer_sweep option bypass must be true or false, got 'maybe'"),
    (["sim", "--policy", "hinted_sweep", "--policy-option", "accuracy=x"],
     "hinted_sweep accuracy must be one number or 1 numbers in [0, 1], got 'x'"),
    (["generate", "--policy", "s3fifo", "--policy-option", "small=nan"],
     "--policy-option: s3fifo option small must be a number, got 'nan'"),
    (["serve", "--policy", "s3fifo", "--policy-option", "small=abc"],
     "--policy-option: s3fifo option small must be a number, got 'abc'"),
    (["generate", "--policy", "frequency"], "--policy frequency needs --profile-trace"),
    (["generate", "--threads", "0"], "--threads must be positive"),
    (["generate", "--lm-head", "int8", "--kernels", "reference"], "--lm-head int8 is read by the host kernels"),
    (["generate", "--lm-head", "int4"], "--lm-head: 'int4' is not one of checkpoint, int8"),
    (["generate", "--max-context", "0"], "--max-context must be positive"),
    (["generate", "--presence-penalty", "3"], "--presence-penalty must lie in [-2, 2], got 3.0"),
    (["generate", "--logit-bias", "5=200"], "--logit-bias takes token ids >= 0 with biases in [-100, 100], got 5=200.0"),
    (["generate", "--logit-bias", "5:2"], "--logit-bias: expected ID=BIAS pairs, got '5:2'"),
    (["generate", "--logit-bias", "99999=1"], "--logit-bias: token id 99999 is not in the vocabulary of 384"),
    (["generate", "--greedy", "--draft", "ngram", "--frequency-penalty", "0.5"],
     "--draft keeps the tokens plain greedy decoding would choose: drop --frequency-penalty"),
    (["sim", "--prefill-chunk", str(2**64)],  # was numba's overflow traceback
     f"--prefill-chunk must be a positive number of tokens, at most 2147483647, got {2**64}"),
    (["bench", "sim", "--prefill-chunk", str(2**64)],
     f"--prefill-chunk must be a positive number of tokens, at most 2147483647, got {2**64}"),
    (["predict", "--model", "qwen3-30b-a3b", "--hardware", "rtx5090-ryzen", "--prefill-chunk", str(2**64)],
     f"prefill chunk / ubatch must be a positive number of tokens, at most 2147483647, got {2**64}"),
    (["bench", "serve", "--threads", "0"], "--threads must be positive, got 0"),  # was taken as torch's default
    (["serve", "--policy", "frequency"], "--policy frequency needs --profile-trace"),
    (["serve", "--backend", "hf", "--capacity", "4"], "--capacity does nothing for --backend hf"),
    (["serve", "--n-cpu-moe", "1", "--policy", "lru"], "--n-cpu-moe does nothing for --policy lru"),
    (["sim", "--n-cpu-moe", "999"], "--n-cpu-moe must lie in [0, 32] (the MoE layers), got 999"),  # not n_cpu_layers
    (["generate", "--n-cpu-moe", "999"],  # the demo's 2, read from its config.json
     f"--n-cpu-moe must lie in [0, 2] ({DEMO_MODEL / 'config.json'} has 2 MoE layers), got 999"),
    (["predict", "--model", "qwen3-30b-a3b", "--hardware", "rtx5090-ryzen", "--fraction", "0"],
     "--fraction must lie in (0, 1], got 0.0 (no cache at all: --capacity 0)"),
])
def test_a_flag_that_does_nothing_is_an_error_naming_it(capsys, argv, message):
    line = _error(capsys, *argv)
    command = " ".join(argv[:2]) if argv[0] == "bench" else argv[0]  # (a bench names its own: "ft bench serve")
    assert line.startswith(f"ft {command}: error: ") and message in line


@pytest.mark.parametrize("argv", [["sim", "--prof", str(DEFAULT_TRACE)], ["serve", "--max-run", "2"],
                                  ["predict", "--n-cpu", "2"], ["generate", "--capa", "2"]])
def test_no_abbreviations(capsys, argv):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err
