"""Generation: sampling by hand-derived numbers, KV-cache prefix reuse, `ft generate` and the shipped demo."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from freetoken.engine import CacheConfig, Engine, Sampler, SamplingParams
from freetoken.paths import DEMO_MODEL
from freetoken.placement import Split

from .conftest import PROMPT

# the demo model's decode on the host kernels (engine/host_decode.py)
HOST_DECODE = "decode: one host call per token (every layer's kernels in C; then each MoE call's placement and counts)"


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    # probs 0.5, 0.3, 0.2: top_p 0.6 keeps {0, 1} (0.5 < 0.6 <= 0.8), renormalised to 0.625 / 0.375
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    sampler = Sampler(SamplingParams(top_p=0.6, seed=1))
    draws = np.array([sampler(logits) for _ in range(4000)])
    assert set(draws.tolist()) == {0, 1}
    assert abs((draws == 0).mean() - 0.625) < 0.03  # 4000 draws: std ~0.008


def test_temperature_and_seed():
    logits = torch.tensor([1.0, 0.0, -1.0])
    s1, s2 = Sampler(SamplingParams(temperature=0.7, seed=5)), Sampler(SamplingParams(temperature=0.7, seed=5))
    assert [s1(logits) for _ in range(50)] == [s2(logits) for _ in range(50)]
    # temperature 0.5 squares the odds: p0 / p1 = e^(1/0.5) = e^2
    s = Sampler(SamplingParams(temperature=0.5, seed=0))
    draws = np.array([s(logits) for _ in range(6000)])
    ratio = (draws == 0).sum() / (draws == 1).sum()
    assert abs(ratio - np.e ** 2) < 0.8  # p0 ~ 0.867, p1 ~ 0.117: ~700 draws of 1, ratio std ~0.3
    assert Sampler(SamplingParams(greedy=True))(torch.tensor([0.1, 3.0, 2.0])) == 1


def test_prefix_reuse_matches_a_fresh_run(checkpoints):
    ckpt = checkpoints["mixtral"]
    sampling = SamplingParams(greedy=True)
    fresh = Engine(ckpt, CacheConfig("lru", capacity=6), kernels="host", device="cpu")
    want = list(fresh.generate(PROMPT + [11, 12, 13], sampling, max_tokens=5, stop_token_ids=[]))
    engine = Engine(ckpt, CacheConfig("lru", capacity=6), kernels="host", device="cpu")
    kv = engine.new_kv(64)
    first = list(engine.generate(PROMPT, sampling, max_tokens=3, stop_token_ids=[], kv=kv))
    assert kv.length == len(PROMPT) + 2 and kv.tokens == PROMPT + first[:2]
    before = engine.stats.prefill_tokens
    got = list(engine.generate(PROMPT + [11, 12, 13], sampling, max_tokens=5, stop_token_ids=[], kv=kv))
    assert got == want
    assert engine.stats.prefill_tokens - before == 3  # only the tokens after the shared prefix were prefilled


def test_stop_token_ends_generation(checkpoints):
    engine = Engine(checkpoints["olmoe"], kernels="host", device="cpu")
    free = list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=6, stop_token_ids=[]))
    stopped = list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=6, stop_token_ids=[free[2]]))
    assert stopped == free[:free.index(free[2]) + 1]


def _ft(capsys, *argv) -> dict:
    from freetoken.cli import main

    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_ft_generate_on_the_demo_equals_hf(capsys, tmp_path):
    """The shipped demo, greedy via the CLI: HF generate gives the same tokens; the counts replay in the simulator."""
    from transformers import AutoModelForCausalLM

    from freetoken.trace import load
    from freetoken.sim.run import SimConfig, simulate

    trace_file = tmp_path / "run.safetensors"
    out = _ft(capsys, "generate", "--token-ids", "5,6,7,8,9,10", "--greedy", "--max-tokens", "8", "--json",
              "--kernels", "host", "--device", "cpu", "--capacity", "6", "--split", "hybrid", "--bp", "1",
              "--bh", "2", "--stop-token-ids", "", "--prefill-chunk", "4", "--record-trace", str(trace_file))
    hf = AutoModelForCausalLM.from_pretrained(DEMO_MODEL).eval()
    with torch.no_grad():
        ref = hf.generate(torch.tensor([[5, 6, 7, 8, 9, 10]]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert out["token_ids"] == ref[0, 6:].tolist()
    split = Split("hybrid", bp=1, bh=2)
    sim = simulate(load(trace_file), SimConfig("lru", split, capacity=6, prefill_chunk=4)).total
    assert (out["hits"], out["misses"], out["fetched"], out["cpu"], out["evictions"]) == (
        sim.hits, sim.misses, sim.fetched, sim.cpu, sim.evictions)
    assert out["cpu"] > 0 and out["fetched"] > 0


def test_ft_generate_chat_uses_the_template(capsys):
    from transformers import AutoTokenizer

    out = _ft(capsys, "generate", "--chat", "--prompt", "hello there", "--max-tokens", "2", "--json",
              "--kernels", "host", "--device", "cpu")
    tok = AutoTokenizer.from_pretrained(DEMO_MODEL)
    want = tok.apply_chat_template([{"role": "user", "content": "hello there"}], add_generation_prompt=True,
                                   tokenize=False)
    assert want.startswith("<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n")
    assert out["prompt_tokens"] == len(tok.encode(want, add_special_tokens=False))
    assert len(out["token_ids"]) <= 2 and isinstance(out["text"], str)


@pytest.mark.parametrize("argv, message", [
    (["--token-ids", "1,a"], "--token-ids: expected comma-separated integers"),
    (["--policy", "belady"], "--policy belady needs --future-trace"),
    (["--capacity", "99"], "capacity 99 exceeds the model's 16 routed experts"),
    (["--split", "hybrid"], "--split hybrid needs --bp > 0 and --bh > 0 (GB/s"),
    (["--device", "nope"], "--device 'nope' is not one of cpu, cuda, cuda:N"),  # was torch's RuntimeError
    pytest.param(["--device", "cuda"], "--device cuda: no CUDA device here",  # was torch's AssertionError
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
    (["--system", "be brief"], "--system applies with --chat (a system turn of the chat template)"),
    (["--max-tokens", "5000"], "the default context of 2048 tokens (--max-context sets it) is too short: the "
                               "prompt's 2 tokens and --max-tokens 5000 need a context of 5001"),  # demo: 2048
    (["--max-context", "4", "--max-tokens", "20"],  # the default prompt "The experts": 2 tokens
     "--max-context 4 is too short: the prompt's 2 tokens and --max-tokens 20 need a context of 21"),
])
def test_ft_generate_bad_input(capsys, argv, message):
    from freetoken.cli import main

    assert main(["generate", "--kernels", "host", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_ft_generate_context_that_just_fits_runs(capsys):
    """The bound of the --max-context check is the KV cache's own: 3 prompt tokens + 32 - 1 fit in 34."""
    out = _ft(capsys, "generate", "--token-ids", "1,2,3", "--max-context", "34", "--max-tokens", "32",
              "--stop-token-ids", "", "--json", "--kernels", "host", "--device", "cpu")
    assert len(out["token_ids"]) == 32 and out["prompt_tokens"] == 3


@pytest.mark.parametrize("argv, message", [
    (["--temperature", "nan"], "--temperature must be a finite number >= 0, got nan"),  # was torch's RuntimeError
    (["--seed", str(2**64)], "--seed must lie in [-9223372036854775808, 18446744073709551615] (torch's 64 bits), "
                             "got 18446744073709551616"),
    (["--seed", str(-2**63 - 1)], "--seed must lie in [-9223372036854775808, 18446744073709551615] (torch's 64 "
                                  "bits), got -9223372036854775809"),
    (["--top-p", "0"], "--top-p must lie in (0, 1], got 0.0"),
    (["--top-k", "-1"], "--top-k must be >= 0, got -1"),
    (["--token-ids", "1,2,3", "--max-context", "4"],  # 3 + 32 - 1: the last sampled token is never stored
     "--max-context 4 is too short: the prompt's 3 tokens and --max-tokens 32 need a context of 34"),
])
def test_ft_generate_flag_errors_come_before_the_model_loads(capsys, monkeypatch, argv, message):
    """What the flags alone decide is one line naming the flag, and no model is loaded for it."""
    from freetoken.cli import cmd_generate, main

    def no_engine(args):
        raise AssertionError("the model was loaded before the flags were checked")

    monkeypatch.setattr(cmd_generate, "build_engine", no_engine)
    assert main(["generate", "--kernels", "host", "--device", "cpu", *argv]) == 2
    assert capsys.readouterr().err == f"ft generate: error: {message}\n"


def test_ft_generate_record_trace_path_mistakes_are_named_before_the_run(capsys, tmp_path):
    """A folder, or a file where a folder should be: one line naming the flag and path, before the model loads
    (the run's output is not lost to a save that was bound to fail)."""
    from freetoken.cli import main

    (tmp_path / "notes").write_text("mine\n")
    for path, why in ((tmp_path, "it is a folder; give a file name"),
                      (tmp_path / "notes" / "t.safetensors", f"{tmp_path / 'notes'} is a file, not a folder")):
        assert main(["generate", "--kernels", "host", "--device", "cpu", "--record-trace", str(path)]) == 2
        assert capsys.readouterr().err == f"ft generate: error: --record-trace {path}: cannot write ({why})\n"
    assert (tmp_path / "notes").read_text() == "mine\n"


def test_demo_build_is_deterministic_and_small(tmp_path):
    from safetensors.torch import load_file

    from freetoken.demo.build import build_demo

    out = build_demo(tmp_path / "demo")
    assert sum(f.stat().st_size for f in out.iterdir()) < 2_000_000
    assert (out / "tokenizer.json").read_text() == (DEMO_MODEL / "tokenizer.json").read_text()
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"]
    got, want = load_file(out / "model.safetensors"), load_file(DEMO_MODEL / "model.safetensors")
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_demo_build_replaces_only_a_demo_checkpoint(tmp_path, capsys):
    """A rebuild replaces a previous build's folder; a folder holding anything else, or a file, is refused by name
    and left as it was (a build replaces the whole folder: `--out ~/models` once deleted it)."""
    from freetoken.cli import main

    demo = tmp_path / "demo"
    assert main(["demo", "build", "--out", str(demo)]) == 0
    assert main(["demo", "build", "--out", str(demo)]) == 0  # its own files only: replaced
    capsys.readouterr()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.txt").write_text("precious\n")
    (tmp_path / "mine" / "config.json").write_text("{}")
    (tmp_path / "note").write_text("x\n")
    for out, message in ((tmp_path / "mine", "holds thesis.txt, not only a demo checkpoint; give a new or empty "
                                             "folder (a build replaces the whole folder)"),
                         (tmp_path / "note", "is a file; give a folder for the demo checkpoint"),
                         (tmp_path / "note" / "demo", f"cannot write ({tmp_path / 'note'} is a file, not a folder)")):
        assert main(["demo", "build", "--out", str(out)]) == 2
        assert capsys.readouterr().err == f"ft demo build: error: {out}: {message}\n"
    assert (tmp_path / "mine" / "thesis.txt").read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo", "mine", "note"]  # no temp folder left


@pytest.mark.slow
def test_ft_generate_progress_line_and_offline_policies(capsys, tmp_path):
    """Text on stdout, the progress line on stderr; belady with the future recorded by a first run of the same
    input is at least as good as lru (it is the offline optimum), frequency pins from a profile trace."""
    from freetoken.cli import main

    base = ["generate", "--token-ids", "3,4,5,6,7,8,9", "--greedy", "--max-tokens", "6", "--kernels", "host",
            "--device", "cpu", "--capacity", "5", "--stop-token-ids", "", "--prefill-chunk", "3"]
    trace = tmp_path / "lru.safetensors"
    assert main(base + ["--record-trace", str(trace)]) == 0
    cap = capsys.readouterr()
    assert cap.out.strip() and "tok/s decode" in cap.err and "hit rate" in cap.err
    assert "placement: lru decides on the host (compiled; its device form runs on CUDA" in cap.err
    assert HOST_DECODE in cap.err
    lru = _ft(capsys, *base, "--json")
    assert main(base + ["--placement", "device", "--eager"]) == 0  # the decision in Triton's interpreter
    err = capsys.readouterr().err
    assert "placement: lru decides on the device" in err and "decode: eager (--eager)" in err
    dev = _ft(capsys, *base, "--json", "--placement", "device")
    assert (dev["token_ids"], dev["hits"], dev["misses"]) == (lru["token_ids"], lru["hits"], lru["misses"])
    assert main(base + ["--policy", "s3fifo", "--placement", "device"]) == 2
    assert capsys.readouterr().err.strip() == ("ft generate: error: placement device: s3fifo has no device form "
                                               "(device: lru, static_layers, frequency)")
    belady = _ft(capsys, *base, "--json", "--policy", "belady", "--future-trace", str(trace))
    assert belady["token_ids"] == lru["token_ids"]  # the cache never changes the tokens
    assert belady["hits"] >= lru["hits"]
    assert belady["hits"] + belady["misses"] == lru["hits"] + lru["misses"]  # same calls, same accesses
    freq = _ft(capsys, *base, "--json", "--policy", "frequency", "--profile-trace", str(trace), "--split", "cpu")
    assert freq["fetched"] == 0 and freq["hits"] > 0 and freq["token_ids"] == lru["token_ids"]


def test_streaming_prefill_live_equals_ft_sim(capsys, tmp_path):
    """--stream-prefill means the same in both commands: the live counts replay exactly, and prefill evicts nothing."""
    trace_file = tmp_path / "run.safetensors"
    common = ["--capacity", "5", "--prefill-chunk", "3", "--stream-prefill"]
    live = _ft(capsys, "generate", "--token-ids", "5,6,7,8,9,10,11", "--greedy", "--max-tokens", "6", "--json",
               "--kernels", "host", "--device", "cpu", "--stop-token-ids", "", "--record-trace",
               str(trace_file), *common)
    sim = _ft(capsys, "sim", "--trace", str(trace_file), "--json", *common)
    assert (live["hits"], live["misses"], live["fetched"], live["cpu"], live["evictions"]) == (
        sim["hits"], sim["misses"], sim["fetched"], sim["cpu"], sim["evictions"])
    assert sim["phases"]["prefill"]["evictions"] == 0 and sim["phases"]["prefill"]["fetched"] > 0
