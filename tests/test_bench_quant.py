"""ft bench quant on CPU: the bytes column against numbers derived by hand, and each slot pool's measured RSS
within 10% of what the cost model says (glibc's mmap threshold pinned, pages zero-filled; run in its own process
so the test process's heap plays no part)."""

import json
import subprocess
import sys

import pytest

# Qwen3-30B-A3B expert, D 2048, I 768 (tests/quant/test_packed_bytes.py derives the int4 and nvfp4 ones)
BY_HAND = {
    "bf16": 3 * 2048 * 768 * 2,  # 9,437,184
    "gptq-g128": 2_469_888,  # 3 x (786,432 data + 24,576 fp16 scales + 12,288 uint8 zeros)
    "awq-g128": 2_469_888,
    "gptq-g128-act": 2_469_888 + 4 * (2048 + 2048 + 768),  # + int32 g_idx over each matrix's inputs
    "gptq-g32": 3 * (786_432 + 49_152 * 3),  # 64 resp. 24 groups: 768 x 64 = 2048 x 24 = 49,152 (scale + zero)
    "fp8-block": 3 * (1_572_864 + 6 * 16 * 4),  # e4m3 + a fp32 scale per 128x128 block
    "fp8-channel": 2 * (1_572_864 + 768 * 4) + 1_572_864 + 2048 * 4,  # a fp32 scale per output row
    "mxfp4": 3 * (786_432 + 1_572_864 // 32),  # e8m0 per 32
    "nvfp4": 3 * (786_432 + 1_572_864 // 16 + 4),  # e4m3 per 16 + one fp32 global scale
}
SLOTS = 8


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "quant.csv"
    code = "import sys; from freetoken.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, "bench", "quant", "--slots", str(SLOTS), "--device", "cpu",
                           "--out", str(out), "--json"], check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), out


@pytest.mark.slow
def test_bytes_per_expert_by_hand(bench):
    rows, _ = bench
    by = {r["name"]: r for r in rows}
    for name, want in BY_HAND.items():
        assert by[name]["bytes_per_expert"] == want, name
        assert by[name]["expected_bytes"] == SLOTS * want
    assert by["gptq-g128"]["vs_bf16"] == pytest.approx(2_469_888 / 9_437_184)


@pytest.mark.slow
def test_measured_rss_matches_the_cost_model(bench):
    rows, csv_path = bench
    assert len(rows) == 11 and {r["method"] for r in rows} == {"process RSS delta"}
    for r in rows:  # 2.5 to 9 MiB per expert x 8: observed within 3%
        assert 0.9 <= r["measured_over_expected"] <= 1.1, r
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("name,description,bytes_per_expert") and len(lines) == 12


def test_a_checkpoint_format_outside_the_names_gets_its_own_row(tmp_path):
    from freetoken.cli.bench_quant import shape_of
    from freetoken.quant.measure import bytes_per_expert, formats

    ck = tmp_path / "ck"
    ck.mkdir()
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 100, "hidden_size": 256, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "num_experts": 8,
           "num_experts_per_tok": 2, "moe_intermediate_size": 128, "dtype": "bfloat16",
           "quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}}
    (ck / "config.json").write_text(json.dumps(cfg))
    hidden, intermediate, fmt, label = shape_of(str(ck))
    assert (hidden, intermediate, label) == (256, 128, "ck")
    names = [n for n, _ in formats(fmt)]
    assert names[-1] == "checkpoint" and len(names) == 12
    # gate/up [128, 256]: 32,768 e4m3 + 2 x 4 blocks of 64x64; down [256, 128]: the same count
    assert bytes_per_expert(fmt, hidden, intermediate) == 3 * (32_768 + 8 * 4)
    assert [n for n, _ in formats(formats()[8][1])][-1] == "nvfp4"  # a named format adds no row


def test_out_that_is_a_folder_is_named_before_measuring(tmp_path, capsys):
    from freetoken.cli import main

    assert main(["bench", "quant", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr() == ("", f"ft bench quant: error: --out {tmp_path}: cannot write (it is a folder; give a "
                                       f"file name)\n")
