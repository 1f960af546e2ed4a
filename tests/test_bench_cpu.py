"""ft bench cpu: the HF comparison end to end on tiny random models (both families, one process, interleaved), its
flags' one-line errors, the table and CSV / JSON output, bytes per token by hand, and the llama.cpp comparison's
plumbing without llama.cpp (a missing llama_cpp is one clear line; the converter wrapper runs a stand-in tree)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import sys
import tarfile

import pytest

from freetoken.cli import main

TINY = ("hidden=64,layers=2,experts=8,top_k=2,moe_intermediate=32,heads=4,kv_heads=2,head_dim=16,vocab=512,"
        "linear_head_dim=16,linear_key_heads=2,linear_value_heads=4,shared_intermediate=32,full_attention_interval=2")


pytestmark = pytest.mark.usefixtures("threads_restored")  # --threads sets them for the process


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    """One real `ft bench cpu --against hf` run on both tiny families: 2 prompt lengths, 1 thread, no RSS children."""
    root = tmp_path_factory.mktemp("bench-cpu")
    out = root / "rows.csv"
    buf = io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(buf):
        assert main(["bench", "cpu", "--work-dir", str(root / "work"), "--shape", TINY, "--prompt-tokens", "9,17",
                     "--decode-tokens", "3", "--reps", "2", "--threads", "1", "--no-rss", "--out", str(out),
                     "--json"]) == 0
    return json.loads(buf.getvalue()), out


@pytest.mark.slow
def test_hf_run_races_both_families_and_both_sides_agree(hf_run):
    result, _ = hf_run
    assert result["against"] == "hf" and result["dtype"] == "bf16" and result["reps"] == 2
    rows = result["rows"]
    assert [(r["family"], r["prompt_tokens"]) for r in rows] == [("qwen3_moe", 9), ("qwen3_moe", 17),
                                                                 ("qwen3_5_moe", 9), ("qwen3_5_moe", 17)]
    for r in rows:
        assert r["matching_tokens"] == 4 and r["same_tokens"] == "4/4"  # same weights, same dtype: same greedy
        assert r["ft_runs"] == r["hf_runs"] == 2 and r["ft_tokens_stable"] and r["hf_tokens_stable"]
        assert r["decode_vs_hf"] == r["ft_decode_tok_s"] / r["hf_decode_tok_s"] > 0
        assert r["prefill_vs_hf"] == r["ft_prefill_tok_s"] / r["hf_prefill_tok_s"] > 0
        assert r["ft_decode_tok_s"] >= r["ft_decode_tok_s_median"]  # best of N is the fastest run
        assert r["ft_peak_rss_bytes"] is None and r["threads"] == 1 and r["ft_mode"] == "--fraction 1"


@pytest.mark.slow
def test_hf_run_writes_its_rows_as_csv(hf_run):
    result, out = hf_run
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(rows) == 4 and {r["table"] for r in rows} == {"rows"}
    assert [float(r["ft_decode_tok_s"]) for r in rows] == pytest.approx([r["ft_decode_tok_s"] for r in result["rows"]])


@pytest.mark.slow
def test_peak_rss_of_ft_generate_in_a_child(tmp_path):
    from freetoken.calibrate.child_rss import ft_generate_rss
    from freetoken.paths import DEMO_MODEL

    rss = ft_generate_rss(str(DEMO_MODEL), ("--fraction", "1"), [5, 6, 7], 2, 1)
    assert 50 * 2**20 < rss < 8 * 2**30  # a real process that imported torch and loaded the model
    with pytest.raises(ValueError, match=r"^peak RSS of ft generate --cpu-moe on .*none: the child run failed: "
                                         r"ft generate: error: .*none"):  # the CLI's line, not the child's assert
        ft_generate_rss(str(tmp_path / "none"), ("--cpu-moe",), [5], 1, 1)


@pytest.mark.slow
def test_rss_against_the_checkpoint_whole_and_net_of_the_process_cost():
    """The fixed cost runs the demo model with the race's prompt ids folded into its vocabulary (ids past it would
    fail the child); the ratios by hand."""
    from freetoken.calibrate.child_rss import checkpoint_bytes, ft_process_rss
    from freetoken.calibrate.vs_llamacpp import _rss_fields
    from freetoken.paths import DEMO_MODEL

    assert checkpoint_bytes(str(DEMO_MODEL)) == (DEMO_MODEL / "model.safetensors").stat().st_size
    assert 50 * 2**20 < ft_process_rss(("--cpu-moe",), [151000, 7, 99999], 2, 1) < 8 * 2**30
    r = _rss_fields(3_000_000_000, 1_000_000_000, 1_600_000_000)
    assert r["rss_vs_checkpoint"] == pytest.approx(1.875) and r["net_rss_vs_checkpoint"] == pytest.approx(1.25)
    assert _rss_fields(None, None, 10)["rss_vs_checkpoint"] is None  # --no-rss


@pytest.mark.parametrize("argv, message", [
    (["--prompt-tokens", "0"], "--prompt-tokens must list positive integers, got 0"),
    (["--prompt-tokens", "a,b"], "--prompt-tokens 'a,b': expected comma-separated integers"),
    (["--threads", "1,1"], "--threads lists a value twice: 1,1"),
    (["--reps", "0"], "--reps must be positive, got 0"),
    (["--decode-tokens", "-1"], "--decode-tokens must be positive, got -1"),
    (["--rows", "ft-bf16-all"], "--rows applies to --against llama.cpp only"),
    (["--against", "llama.cpp", "--dtype", "fp32"], "--dtype applies to --against hf only"),
    (["--dtype", "fp16"], "--dtype 'fp16' is not one of bf16, fp32"),
    (["--ft-mode", "half"], "--ft-mode 'half' is not one of cpu-moe, cpu-moe-int8-head, all"),
    (["--family", "mixtral"], "--family 'mixtral': expected a comma-separated list of qwen3_moe, qwen3_5_moe"),
    (["--shape", "hidden=0"], "--shape: shape hidden must be a positive integer, got 0"),
    (["--shape", "depth=3"], "--shape 'depth=3': expected KEY=INT with KEY one of hidden,"),
    (["--shape", "hidden=x"], "--shape 'hidden=x': 'x' is not an integer"),
    (["--out", "table.txt"], "--out table.txt: give a .csv or .json file name"),
    (["--model", "/nonexistent/ckpt"], "--model /nonexistent/ckpt: no such checkpoint directory"),
])
def test_bad_flags_are_one_line_naming_the_flag(capsys, argv, message):
    assert main(["bench", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ft bench cpu: error: {message}") and err.count("\n") == 1


def test_a_work_dir_that_is_a_file_is_named(capsys, tmp_path):
    (tmp_path / "f").write_text("")
    assert main(["bench", "cpu", "--work-dir", str(tmp_path / "f")]) == 2
    assert capsys.readouterr().err == f"ft bench cpu: error: --work-dir {tmp_path / 'f'}: cannot write (it is a file)\n"


def test_llama_cpp_missing_is_one_clear_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp raises ImportError
    assert main(["bench", "cpu", "--against", "llama.cpp", "--work-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ft bench cpu: error: --against llama.cpp needs llama-cpp-python, which cannot be imported")
    assert err.count("\n") == 1 and "pip install llama-cpp-python" in err
    assert not any(tmp_path.iterdir())  # refused before anything was built


def test_rows_are_checked_by_name():
    from freetoken.calibrate.vs_llamacpp import parse_rows

    assert parse_rows("ft-gptq-all, llama-q4_0,ft-gptq-all") == ("ft-gptq-all", "llama-q4_0")
    with pytest.raises(ValueError, match="--rows 'llama-q5': expected a comma-separated list of llama-bf16"):
        parse_rows("llama-q5")


def test_the_engine_modes_are_what_ft_generate_builds_from_the_same_flags():
    from freetoken.calibrate.sides import FT_MODES
    from freetoken.cli import build_parser
    from freetoken.cli.common import cache_config_from_args

    for mode in FT_MODES.values():
        args = build_parser().parse_args(["generate", *mode.flags])
        assert mode.cache() == cache_config_from_args(args)
        assert mode.lm_head == args.lm_head


def test_bytes_per_token_by_hand():
    from freetoken.calibrate.traffic import GGUF_EXPERTS, classify

    sizes = [("token_embd.weight", 32000 * 100), ("output.weight", 5000), ("blk.0.attn_q.weight", 300),
             ("blk.0.ffn_gate_exps.weight", 6400), ("blk.0.ffn_down_exps.weight", 3200), ("blk.0.attn_norm.weight", 8)]
    t = classify(sizes, lambda n: bool(GGUF_EXPERTS.search(n)), "token_embd.weight", "output.weight", top_k=8,
                 experts=64, vocab=32000)
    assert (t.experts, t.dense, t.lm_head, t.embedding_row) == (800 + 400, 308, 5000, 100)
    assert t.total == 6608 and t.to_dict()["total"] == 6608


def test_engine_bytes_per_token_counts_packed_experts_and_dense_tensors():
    """The demo checkpoint (fp32): 2 MoE layers, top-2 of 8 experts of 3 x 64 x 32; dense tensors read whole, the
    embedding one row, lm_head apart."""
    from freetoken.calibrate.traffic import engine_traffic
    from freetoken.engine import Engine
    from freetoken.models.checkpoint import load_checkpoint
    from freetoken.paths import DEMO_MODEL

    ckpt = load_checkpoint(DEMO_MODEL)
    t = engine_traffic(Engine(ckpt, kernels="auto", device="cpu", record=False))
    assert t.experts == 2 * 2 * 3 * 64 * 32 * 4 and t.lm_head == 384 * 64 * 4 and t.embedding_row == 64 * 4
    dense = sum(v.numel() * 4 for k, v in ckpt.dense.items() if k not in ("lm_head.weight", "model.embed_tokens.weight"))
    assert t.dense == dense


def test_the_table_and_its_files(tmp_path):
    from freetoken.calibrate.cpu_table import LLAMA_COLUMNS, RATIO_COLUMNS, csv_text, format_table, write_out

    rows = [{"engine": "llama.cpp", "weights": "bf16", "mode": None, "threads": 1, "prompt_tokens": 512,
             "decode_tok_s": 56.24, "prefill_tok_s": 240.71, "bytes_per_token": 3.5e8, "read_pct": 0.671,
             "peak_rss_bytes": 1.98e9, "rss_vs_checkpoint": 0.97, "bytes": {"experts": 1}},
            {"engine": "ft", "weights": "bf16", "mode": "--cpu-moe", "threads": 1, "prompt_tokens": 512,
             "decode_tok_s": 10.4, "prefill_tok_s": 200.6, "bytes_per_token": 3.5e8, "read_pct": 0.12,
             "peak_rss_bytes": None, "rss_vs_checkpoint": None, "net_rss_vs_checkpoint": None,
             "tokens_vs_llama_bf16": "33/33"}]
    lines = format_table(LLAMA_COLUMNS, rows).splitlines()
    assert lines[0].split()[:4] == ["engine", "weights", "mode", "thr"]
    assert lines[1].split() == ["llama.cpp", "bf16", "-", "1", "512", "56.2", "240.7", "350.0", "67%", "1.98", "0.97", "-", "-"]
    assert lines[2].split() == ["ft", "bf16", "--cpu-moe", "1", "512", "10.4", "200.6", "350.0", "12%", "-", "-", "-", "33/33"]
    ends = [line.index(cell) + len(cell) for line, cell in zip(lines, ("decode tok/s", "56.2", "10.4"))]
    assert len(set(ends)) == 1  # numbers right-aligned under their header
    ratios = [{"threads": 1, "prompt_tokens": 512, "ft": "ft bf16 --cpu-moe", "against": "llama.cpp bf16",
               "decode_ratio": 10.4 / 56.24, "prefill_ratio": 200.6 / 240.71}]
    assert format_table(RATIO_COLUMNS, ratios).splitlines()[1].split()[-2:] == ["0.18", "0.83"]
    back = list(csv.DictReader(io.StringIO(csv_text(rows))))
    assert back[0]["bytes"] == '{"experts": 1}' and back[1]["tokens_vs_llama_bf16"] == "33/33"
    assert back[0]["tokens_vs_llama_bf16"] == "" and float(back[1]["decode_tok_s"]) == 10.4
    result = {"rows": rows, "ratios": ratios}
    write_out(str(tmp_path / "r.json"), result)
    assert json.loads((tmp_path / "r.json").read_text()) == result
    write_out(str(tmp_path / "r.csv"), result)
    back = list(csv.DictReader(io.StringIO((tmp_path / "r.csv").read_text())))
    assert [r["table"] for r in back] == ["rows", "rows", "ratios"] and back[2]["decode_ratio"] != ""


def test_the_converter_runs_through_the_wrapper_that_names_the_pre_tokenizer(tmp_path):
    """A stand-in llama.cpp tree (conversion/base.py's TextModel, convert_hf_to_gguf.main) records what the real
    converter would be asked: the wrapper's pre-tokenizer and the command line."""
    from freetoken.calibrate.llamacpp import convert, converter_source

    tree = tmp_path / "llama.cpp"
    (tree / "conversion").mkdir(parents=True)
    (tree / "conversion" / "__init__.py").write_text("")
    (tree / "conversion" / "base.py").write_text(
        "class TextModel:\n    def get_vocab_base_pre(self, tokenizer):\n        raise NotImplementedError('BPE')\n")
    (tree / "convert_hf_to_gguf.py").write_text(
        "import sys\nfrom conversion.base import TextModel\n"
        "def main():\n    out = sys.argv[sys.argv.index('--outfile') + 1]\n"
        "    open(out, 'w').write(TextModel().get_vocab_base_pre(None) + ' ' + ' '.join(sys.argv[1:]))\n")
    assert converter_source(str(tree), tmp_path) == tree
    out = convert(tree, tmp_path / "model", tmp_path / "m.gguf", "bf16")
    assert out.read_text() == f"qwen2 {tmp_path / 'model'} --outfile {tmp_path / 'm.gguf.partial'} --outtype bf16"
    (tree / "convert_hf_to_gguf.py").write_text("raise SystemExit('converter: unknown model')\n")
    with pytest.raises(ValueError, match="llama.cpp's converter .* failed on .*: converter: unknown model"):
        convert(tree, tmp_path / "model", tmp_path / "n.gguf")
    assert not (tmp_path / "n.gguf").exists() and not (tmp_path / "n.gguf.partial").exists()


def test_converter_source_from_the_flag_the_environment_or_an_sdist(tmp_path, monkeypatch):
    from freetoken.calibrate.llamacpp import ENV_SRC, converter_source, extract_converter

    with pytest.raises(ValueError, match=r"--llama-cpp-src .*nowhere: no convert_hf_to_gguf.py there"):
        converter_source(str(tmp_path / "nowhere"), tmp_path)
    sdist_root = tmp_path / "src" / "llama_cpp_python-9.9"
    vendor = sdist_root / "vendor" / "llama.cpp"
    for rel in ("convert_hf_to_gguf.py", "conversion/base.py", "gguf-py/gguf/__init__.py", "ggml/src/big.c"):
        (vendor / rel).parent.mkdir(parents=True, exist_ok=True)
        (vendor / rel).write_text("# " + rel)
    monkeypatch.setenv(ENV_SRC, str(sdist_root))  # an sdist root: its vendor/llama.cpp is the tree
    assert converter_source(None, tmp_path) == vendor
    sdist = tmp_path / "llama_cpp_python-9.9.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(sdist_root, arcname="llama_cpp_python-9.9")
    extract_converter(sdist, tmp_path / "cache")
    got = sorted(p.relative_to(tmp_path / "cache").as_posix() for p in (tmp_path / "cache").rglob("*") if p.is_file())
    assert got == ["vendor/llama.cpp/conversion/base.py", "vendor/llama.cpp/convert_hf_to_gguf.py",
                   "vendor/llama.cpp/gguf-py/gguf/__init__.py"]  # the C sources stay in the archive


def test_llama_cpp_comparison_starts_from_bf16_weights(capsys, monkeypatch, tmp_path):
    import types

    from freetoken.paths import DEMO_MODEL

    monkeypatch.setitem(sys.modules, "llama_cpp", types.ModuleType("llama_cpp"))  # importable, never called here
    assert main(["bench", "cpu", "--against", "llama.cpp", "--model", str(DEMO_MODEL), "--work-dir",
                 str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"ft bench cpu: error: --model {DEMO_MODEL}: --against llama.cpp starts from "
                                       f"bf16 weights (the bf16 rows compare them as they are, the other rows are "
                                       f"made from them)\n")


def test_a_llama_cpp_child_killed_by_a_signal_says_so():
    """A wheel built for another CPU dies with SIGILL after llama.cpp's loader log: the message names the signal and
    the fix, not the log's last line."""
    import subprocess

    from freetoken.calibrate.llamacpp import child_failure

    log = "llama_model_loader: - type bf16:   86 tensors"
    assert "SIGILL" in child_failure(subprocess.CompletedProcess([], -4, "", log))
    assert "GGML_NATIVE" in child_failure(subprocess.CompletedProcess([], -4, "", log))
    assert child_failure(subprocess.CompletedProcess([], -9, "", log)) == "killed by SIGKILL"
    assert child_failure(subprocess.CompletedProcess([], 1, "", "a\nbad file")) == "bad file"
