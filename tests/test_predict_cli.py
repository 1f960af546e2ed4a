"""ft predict end to end, and predictions checked against bounds derived by hand from the cards."""

import json

import numpy as np
import pytest

from freetoken.cli import main
from freetoken.trace import RoutingTrace, save
from freetoken.sim.hardware import load_hardware
from freetoken.sim.model_card import load_model_card
from freetoken.sim.predict import predict, synthetic_trace


def run_json(capsys, *args) -> dict:
    assert main(["predict", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_json_matches_the_library(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    out = run_json(capsys, "--model", "qwen3-30b-a3b", "--hardware", "rtx4060-laptop", "--engine",
                   "freetoken-offload", "--prompt-tokens", "256", "--decode-tokens", "16")
    for key in ("decode_tok_s", "prefill_tok_s", "ttft_s", "capacity_experts", "miss_rate"):
        assert key in out
    card, hw = load_model_card("qwen3-30b-a3b"), load_hardware("rtx4060-laptop")
    ref = predict(card, hw, "freetoken-offload", synthetic_trace(card, 256, 16))
    assert out["decode_tok_s"] == pytest.approx(ref.decode_tok_s)
    assert (out["prompt_tokens"], out["decode_tokens"]) == (256, 16)
    assert out["ttft_s"] == pytest.approx(out["prefill_s"])  # one request, one turn


def test_decode_bounds_by_hand():
    # Qwen3-30B-A3B bf16 on the 4060 laptop (8 GiB): a decode token reads the dense weights (1.23 B x 2 B =
    # 2.46 GB) at 256 GB/s = 9.6 ms at least, and each missed expert (9.44 MB) crosses PCIe x8 at 11.8 GB/s.
    card, hw = load_model_card("qwen3-30b-a3b"), load_hardware("rtx4060-laptop")
    trace = synthetic_trace(card, 64, 32)
    p = predict(card, hw, "freetoken-offload", trace)
    misses_per_token = p.miss_rate_decode * 48 * 8
    floor = 2.46e9 / 256e9 + misses_per_token * 9_437_184 / 11.8e9
    assert 1 / p.decode_tok_s >= floor
    # an all-CPU split moves the same misses over BH = 47.5 GB/s instead: faster on this PCIe x8 laptop
    cpu = predict(card, hw, "ktransformers", trace)
    assert cpu.decode_tok_s > p.decode_tok_s


def test_resident_decode_is_the_bandwidth_roofline():
    # Mixtral bf16 fully resident on an H200: per token dense 1.474 B x 2 B + 32 layers x 2 experts x 352 MB,
    # plus KV at (context + 1) x 128 KiB, all at 4.8 TB/s x gemv_efficiency 0.9 (the achieved rate); compute is far
    # below the ridge at one token, and the step's one CUDA-graph launch (4 us) hides behind the first layer's reads;
    # each layer's 20 device kernels (sim.overhead.GRAPH_KERNELS_PER_LAYER) add their 1 us floor (kernel_floor_us).
    card, hw = load_model_card("mixtral-8x7b"), load_hardware("h200")
    trace = synthetic_trace(card, 16, 8)
    p = predict(card, hw, "resident", trace)
    assert p.capacity_experts == 256 and p.miss_rate == 0
    per_token_bytes = 1.474e9 * 2 + 64 * 352_321_536
    kv = sum((16 + i + 1) * 131072 for i in range(8)) / 8
    assert 1 / p.decode_tok_s == pytest.approx((per_token_bytes + kv) / (4.8e12 * 0.9) + 32 * 20 * 1e-6,
                                               rel=1e-6)


def test_llamacpp_cmoe_decode_all_on_cpu_prefill_copies():
    card, hw = load_model_card("qwen3-30b-a3b"), load_hardware("rtx5090-ryzen")
    p = predict(card, hw, "llamacpp-cmoe", synthetic_trace(card, 1024, 8))
    assert p.miss_rate == 1.0
    # decode: every expert on the CPU, nothing fetched; prefill chunks of 512 >= 32 tokens: every used expert copied
    # (the Q4_K_M expert: 4,718,592 params x 4.85 bits / 8 = 2,860,646 bytes)
    used = 2 * 48 * 128  # two 512-token chunks use every expert of every layer (4096 picks over 128)
    assert p.cpu_gb == pytest.approx(8 * 48 * 8 * 2_860_646 / 1e9)
    assert p.fetched_gb == pytest.approx(used * 2_860_646 / 1e9, rel=0.01)


def test_ncmoe_takes_n_and_checks_it(capsys):
    card, hw = load_model_card("qwen3-30b-a3b"), load_hardware("rtx5090-ryzen")
    trace = synthetic_trace(card, 8, 8)
    p = predict(card, hw, "llamacpp-ncmoe", trace, n_cpu_layers=40)
    assert p.inputs["n_cpu_layers"] == 40
    assert p.miss_rate_decode == pytest.approx(40 / 48)  # the first 40 of 48 layers miss every expert
    with pytest.raises(ValueError, match="n-cpu-moe applies to static-layer engines"):
        predict(card, hw, "freetoken-offload", trace, n_cpu_layers=4)


def test_trace_of_another_shape_is_refused(capsys, tmp_path):
    path = tmp_path / "mixtral-shaped.safetensors"
    save(RoutingTrace(np.zeros((4, 32, 2), np.int16) + np.array([0, 1], np.int16), 8, model="m"), path)
    assert main(["predict", "--model", "qwen3-30b-a3b", "--hardware", "h200", "--trace", str(path)]) == 2
    err = capsys.readouterr().err
    assert "routes 32 MoE layers x 8 experts, top-2; model qwen3-30b-a3b has 48 x 128, top-8" in err


def test_cli_errors_are_one_line(capsys):
    assert main(["predict", "--model", "nope", "--hardware", "h200"]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err
    assert main(["predict", "--model", "qwen3.5-122b-a10b", "--hardware", "rtx5090-ryzen", "--engine",
                 "resident", "--prompt-tokens", "8", "--decode-tokens", "1"]) == 2
    assert "all 12288 experts of qwen3.5-122b-a10b need" in capsys.readouterr().err


def test_rule_option_switches_the_hybrid_split(capsys):
    # m = 8 misses at BP 56, BH 63.6: balanced q = 8 x 56 / 119.6 = 3.75 -> 4 (max(4/56, 4/63.6) = .0714 beats
    # q = 3: max(.0536, .0786)); paper q = round(8 x 56 / 63.6) = 7. With an empty cache (capacity 0) every decode
    # call misses all 8: the CPU share of the misses is 4/8 vs 1/8.
    common = ["--model", "qwen3-30b-a3b", "--hardware", "rtx5090-ryzen", "--engine", "freetoken-hybrid",
              "--capacity", "0", "--prompt-tokens", "0", "--decode-tokens", "4"]
    bal = run_json(capsys, *common, "--rule", "balanced")
    paper = run_json(capsys, *common, "--rule", "paper")
    per_expert_gb = 9_437_184 / 1e9
    assert bal["cpu_gb"] == pytest.approx(4 * 48 * 4 * per_expert_gb)
    assert paper["cpu_gb"] == pytest.approx(4 * 48 * 1 * per_expert_gb)
    assert bal["engine"] == "freetoken-hybrid (rule balanced)"
    assert main(["predict", *common[:4], "--engine", "freetoken-offload", "--rule", "paper"]) == 2
    assert "--rule applies to hybrid engines" in capsys.readouterr().err


def test_bench_profile_replaces_the_lane_bandwidths(capsys, tmp_path):
    from freetoken.calibrate.profile import save_profile
    from freetoken.sim.hardware import with_bench_profile

    from freetoken.calibrate.measure import Rate
    from freetoken.calibrate.repeat import Repeated

    def lane(*readings):  # ft bench bw's lane entry: its readings, their median as gb_s
        return Repeated(tuple(Rate(r, r, 1.0, 3, 1000) for r in readings)).to_dict()

    profile = {"version": 2, "key": "x|int4", "expert_format": "int4", "geometry": {}, "threads": 8, "repeats": 3,
               "host": lane(70.0, 69.0, 71.0), "cpu_lane": lane(41.0, 40.0, 12.0),
               "pcie": {"gb_s": 25.0, "gather": lane(25.0, 24.0, 26.0)},
               "overlap": {"cpu_lane": lane(30.0, 29.0, 31.0), "gather": lane(20.0, 19.5, 20.5)},
               "recommendation": {"mode": "hybrid", "bp_gb_s": 25.0, "bh_gb_s": 40.0}}
    path = save_profile(profile, tmp_path / "bw.json")
    hw = with_bench_profile(load_hardware("rtx5090-ryzen"), profile, str(path))
    assert (hw.pcie_gb_s, hw.host_gb_s, hw.dram_gb_s) == (25.0, 40.0, 50.0)  # DRAM: 30 + 20 moved together
    assert "ft bench bw" in hw.sources["pcie_gb_s"]
    args = ["--model", "qwen3-30b-a3b", "--hardware", "rtx5090-ryzen", "--engine", "freetoken-hybrid",
            "--prompt-tokens", "64", "--decode-tokens", "8"]
    out = run_json(capsys, *args, "--bw-profile", str(path))
    card = load_model_card("qwen3-30b-a3b")
    ref = predict(card, hw, "freetoken-hybrid", synthetic_trace(card, 64, 8))
    assert out["decode_tok_s"] == pytest.approx(ref.decode_tok_s)
    assert out["inputs"]["bp_gb_s"] == 25.0
    base = predict(card, load_hardware("rtx5090-ryzen"), "freetoken-hybrid", synthetic_trace(card, 64, 8))
    assert base.decode_tok_s > ref.decode_tok_s  # slower measured lanes, slower decode


def test_warmup_is_replayed_but_not_reported(capsys):
    """A warm-up changes what the request meets, not what is reported: the measured request's decode time is the
    whole run's minus the warm-up's alone (replay and charge are causal), and a warm LRU misses less in decode."""
    from freetoken.sim.engines import get_engine
    from freetoken.sim.predict import join_after, warmup_split

    card, hw, engine = load_model_card("qwen3-30b-a3b"), load_hardware("rtx5090-ryzen"), get_engine("freetoken-offload")
    measured, warm = warmup_split(synthetic_trace(card, 64, 24 + 16), 16)
    assert (measured.num_tokens, warm.num_tokens) == (64 + 24, 16) and (warm.phase == 1).all()
    hot = predict(card, hw, engine, measured, warmup=warm, capacity=2000)
    both = predict(card, hw, engine, join_after(warm, measured), capacity=2000)
    alone = predict(card, hw, engine, warm, capacity=2000)
    assert (hot.prompt_tokens, hot.decode_tokens) == (64, 24)
    assert hot.decode_s == pytest.approx(both.decode_s - alone.decode_s, rel=1e-9)
    assert hot.prefill_s == pytest.approx(both.prefill_s, rel=1e-9)
    cold = predict(card, hw, engine, measured, capacity=2000)
    assert hot.miss_rate_decode < cold.miss_rate_decode
    out = run_json(capsys, "--model", "qwen3-30b-a3b", "--hardware", "rtx5090-ryzen", "--engine",
                   "freetoken-offload", "--prompt-tokens", "64", "--decode-tokens", "24", "--warmup-decode", "16",
                   "--capacity", "2000")
    assert out["decode_tok_s"] == pytest.approx(hot.decode_tok_s)


def test_gpu_probe_sets_the_per_kernel_costs_and_efficiencies():
    # ft bench bw's GPU probe (CUDA only) measured on a 5090: efficiencies are measured / datasheet, by hand
    from freetoken.sim.hardware import with_bench_profile

    profile = {"host": {"gb_s": 70.0}, "cpu_lane": {"gb_s": 40.0},
               "gpu_probe": {"launch_us": 3.1, "dispatch_us": 5.0, "sync_us": 9.5, "kernel_floor_us": 1.4,
                             "gemm_tflops": 150.84, "gemv_gb_s": 1612.8}}
    hw = with_bench_profile(load_hardware("rtx5090-ryzen"), profile, "probe.json")
    assert (hw.launch_us, hw.sync_us, hw.kernel_floor_us) == (3.1, 9.5, 1.4)
    assert hw.gemm_efficiency == pytest.approx(150.84 / 209.5)
    assert hw.gemv_efficiency == pytest.approx(1612.8 / 1792.0)
    assert hw.sources["gemm_efficiency"] == "ft bench bw (probe.json): gpu_probe.gemm_tflops"


def test_demo_model_is_overhead_bound(capsys):
    # the 2-layer demo model: bytes and FLOPs are nothing, so a decode token costs its host work. Per MoE layer
    # (eager, all resident, one expert_ffn), with the Triton set's fusions: 11 kernel-set launches (add_norm_linear:
    # the residual add, input norm and q/k/v; qk_norm_rope; attention 2; o; add_rms_norm; router linear + top-k;
    # expert_ffn 3) and no glue; layer 0 also the final norm and lm_head (2) and 2 glue ops (embedding, positions);
    # each kernel 4 us (driver) + 4.2 us (Triton dispatch); one routing sync of 8 us a layer. Before each router:
    # 8 launches (65.6 us) + 8 us; after: 3 (+ 4 on layer 0) = 24.6 / 57.4 us, above the GPU's kernel floors.
    # Token: 2 x 73.6 + 24.6 + 57.4 = 229.2 us.
    out = run_json(capsys, "--model", "freetoken/demo/model", "--hardware", "rtx5090-ryzen", "--prompt-tokens",
                   "64", "--decode-tokens", "16", "--no-band")
    assert out["inputs"]["host_work_per_decode_token"] == {"launches": 24.0, "syncs": 2.0, "copies": 4.0}
    assert 1 / out["decode_tok_s"] == pytest.approx(229.2e-6, rel=1e-3)


def test_speculative_and_batched_decode_flags_match_the_library(capsys):
    from freetoken.sim.batch import Speculation, predict_batched, predict_speculative
    from freetoken.sim.engines import get_engine

    args = ["--model", "qwen3-30b-a3b", "--hardware", "rtx5090-ryzen", "--engine", "llamacpp-cmoe",
            "--prompt-tokens", "64", "--decode-tokens", "16", "--no-band"]
    out = run_json(capsys, *args, "--draft-depth", "2", "--acceptance", "0.7", "--batch", "2")
    card, hw, engine = load_model_card("qwen3-30b-a3b"), load_hardware("rtx5090-ryzen"), get_engine("llamacpp-cmoe")
    trace = synthetic_trace(card, 64, 16)
    spec = predict_speculative(card, hw, engine, trace, Speculation(2, 0.7), out["decode_tok_s"])
    assert out["variants"]["speculative"]["tok_s"] == pytest.approx(spec.tok_s)
    assert out["variants"]["speculative"]["tokens_per_step"] == pytest.approx(1 + 0.7 + 0.49)
    both = predict_batched(card, hw, engine, [trace, synthetic_trace(card, 64, 16, seed=1)])
    assert out["variants"]["batched"]["tok_s"] == pytest.approx(both.tok_s)
    assert main(["predict", *args, "--draft-depth", "2"]) == 2
    assert "give both --draft-depth and --acceptance" in capsys.readouterr().err


def test_double_buffer_flag_charges_the_streamed_calls(capsys):
    # Qwen3-30B-A3B (48 MoE layers x 128 experts), a cold cache and two 2048-token prefill chunks: every call fetches
    # its layer's 128 experts (a chunk uses each: (1 - 8/128)^2048 ~ 1e-57 unused) and prefill admits none, so the
    # cache stays empty. With the double buffer the 2 x 47 calls of layers >= 1 get those 128 streamed instead: the
    # same expert copies, one expert_ffn call instead of the pipeline's two halves (one slot-id upload, one
    # expert_ffn's launches fewer each), and the copies start a call early
    from freetoken.kernel_launches import KERNEL_LAUNCHES

    args = ["--model", "qwen3-30b-a3b", "--hardware", "rtx5090-ryzen", "--prompt-tokens", "4096",
            "--decode-tokens", "8", "--no-band"]
    off, on = (run_json(capsys, *args, "--double-buffer", v) for v in ("off", "on"))
    assert (off["inputs"]["engine_settings"]["double_buffer"], on["inputs"]["engine_settings"]["double_buffer"]) == (
        False, True)
    assert off["capacity_experts"] - on["capacity_experts"] == 128  # the second layer of staging
    a, b = off["inputs"]["host_work_prefill"], on["inputs"]["host_work_prefill"]
    assert a["copies"] - b["copies"] == 94 and a["syncs"] == b["syncs"]
    assert a["launches"] - b["launches"] == 94 * KERNEL_LAUNCHES["expert_ffn"]
    assert on["prefill_tok_s"] > off["prefill_tok_s"] and on["fetched_gb"] == off["fetched_gb"]
    assert main(["predict", *args, "--engine", "freetoken-hybrid", "--double-buffer", "on"]) == 2
    assert "double_buffer: freetoken streams" in capsys.readouterr().err


def test_decode_overlap_flag_reaches_the_engine(capsys):
    # off: a decode call's copies wait for the hits' GEMMs and the fetched experts wait for the copies, so a
    # miss-heavy decode (Qwen3-30B-A3B on the 8 GB laptop: a few hundred cached experts) can only get slower
    args = ["--model", "qwen3-30b-a3b", "--hardware", "rtx4060-laptop", "--kv-floor", "4096", "--prompt-tokens", "64",
            "--decode-tokens", "8", "--no-band"]
    on, off = (run_json(capsys, *args, "--decode-overlap", v) for v in ("on", "off"))
    assert (on["inputs"]["engine_settings"]["decode_overlap"], off["inputs"]["engine_settings"]["decode_overlap"]) == (
        True, False)
    assert off["decode_tok_s"] < on["decode_tok_s"] and off["prefill_tok_s"] == on["prefill_tok_s"]


def test_decode_gather_flag_slows_decode_copies_only(capsys):
    # a decode gather below BP (11.8 GB/s on the 8 GB laptop, where Qwen3-30B-A3B's decode misses): the same
    # replay, every decode copy slower, prefill (the copy engine's) unchanged; a rate above BP is capped at BP
    args = ["--model", "qwen3-30b-a3b", "--hardware", "rtx4060-laptop", "--kv-floor", "4096", "--prompt-tokens", "64",
            "--decode-tokens", "8", "--no-band", "--engine", "freetoken-offload"]
    base, slow, above = (run_json(capsys, *args, *extra) for extra in
                         ([], ["--decode-gather-gb-s", "5"], ["--decode-gather-gb-s", "50"]))
    assert (base["inputs"]["engine_settings"]["decode_gather_gb_s"], slow["inputs"]["engine_settings"][
        "decode_gather_gb_s"]) == ("BP", 5.0)
    assert base["miss_rate"] == slow["miss_rate"] and base["fetched_gb"] == slow["fetched_gb"] > 0
    assert slow["decode_tok_s"] < base["decode_tok_s"] and slow["prefill_tok_s"] == base["prefill_tok_s"]
    assert above["decode_tok_s"] == base["decode_tok_s"]


def test_prefill_split_flag_fetches_every_prefill_miss(capsys):
    # Qwen3-30B-A3B (48 MoE layers x 128 experts of 9,437,184 bytes), a cold cache, two 2048-token prefill chunks and
    # no decode: every call misses its layer's 128 experts (as above) and prefill admits none. freetoken-hybrid's own
    # prefill (paper rule, BP 56.0, BH 63.6): q* = round(128 x 56 / 63.6) = 113 fetched, 15 on the CPU, per call;
    # --prefill-split offload: all 128 fetched, none on the CPU. With the double buffer as well, its prefill is
    # freetoken-offload's with the double buffer, call for call
    args = ["--model", "qwen3-30b-a3b", "--hardware", "rtx5090-ryzen", "--prompt-tokens", "4096",
            "--decode-tokens", "0", "--no-band"]
    S, calls = 9_437_184, 2 * 48
    same = run_json(capsys, *args, "--engine", "freetoken-hybrid")
    split = run_json(capsys, *args, "--engine", "freetoken-hybrid", "--prefill-split", "offload")
    assert same["inputs"]["engine_settings"]["prefill_split"] == "same"
    assert split["inputs"]["engine_settings"]["prefill_split"] == "offload"
    assert same["inputs"]["expert_bytes"] == S
    assert (same["fetched_gb"], same["cpu_gb"]) == pytest.approx((calls * 113 * S / 1e9, calls * 15 * S / 1e9))
    assert (split["fetched_gb"], split["cpu_gb"]) == pytest.approx((calls * 128 * S / 1e9, 0.0))
    both = run_json(capsys, *args, "--engine", "freetoken-hybrid", "--prefill-split", "offload", "--double-buffer", "on")
    offload = run_json(capsys, *args, "--engine", "freetoken-offload", "--double-buffer", "on")
    assert both["prefill_tok_s"] == pytest.approx(offload["prefill_tok_s"], rel=1e-12)
    assert both["inputs"]["host_work_prefill"] == offload["inputs"]["host_work_prefill"]
    with pytest.raises(SystemExit):  # argparse's choices: one line naming the flag
        main(["predict", *args, "--prefill-split", "cpu"])
    assert "argument --prefill-split: invalid choice: 'cpu'" in capsys.readouterr().err


@pytest.mark.parametrize("flag, write, message", [
    ("--model", lambda p: p.write_text("x: [\n"),
     "{p}: not valid YAML (line 2, column 1: expected the node content, but found '<stream end>')"),
    ("--model", lambda p: p.write_bytes(b"\xd0\x01"), "{p}: not a YAML text file (invalid continuation byte at byte 0)"),
    ("--hardware", lambda p: p.write_bytes(b"\xff"), "{p}: not a YAML text file (invalid start byte at byte 0)"),
    ("--bw-profile", lambda p: p.write_bytes(b"\xff"),
     "{p}: not a JSON text file (invalid start byte at byte 0); rerun `ft bench bw`"),
    ("--bw-profile", lambda p: p.mkdir(), "{p}: cannot read the bandwidth profile (Is a directory)"),
    ("--bw-profile", lambda p: None, "{p}: cannot read the bandwidth profile (No such file or directory)"),
])
def test_an_unreadable_input_file_is_one_line_naming_it(capsys, tmp_path, flag, write, message):
    """Before: PyYAML's four-line message, a bare UnicodeDecodeError without the file, '[Errno 21] ...'."""
    path = tmp_path / ("in.json" if flag == "--bw-profile" else "in.yaml")
    write(path)
    args = {"--model": "qwen3-30b-a3b", "--hardware": "rtx5090-ryzen", flag: str(path)}
    assert main(["predict", *[a for kv in args.items() for a in kv], "--no-band"]) == 2
    assert capsys.readouterr().err == f"ft predict: error: {message.format(p=path)}\n"


def test_prefill_copies_layer_copies_every_expert_of_each_prefill_layer(capsys):
    # Qwen3-30B-A3B (48 MoE layers x 128 experts of 9,437,184 bytes), one 64-token chunk and no decode: 64 x top-8
    # picks leave experts of each layer unused, which `missing` never copies; `layer` copies all 128 of each of the
    # 48 layers at BP 56.0 GB/s, plus the 2 us fetch latency per call (rtx5090-ryzen)
    args = ["--model", "qwen3-30b-a3b", "--hardware", "rtx5090-ryzen", "--prompt-tokens", "64", "--decode-tokens",
            "0", "--no-band", "--engine", "freetoken-offload"]
    missing, layer = (run_json(capsys, *args, "--prefill-copies", c) for c in ("missing", "layer"))
    assert layer["inputs"]["engine_settings"]["prefill_copies"] == "layer"
    assert layer["lane_busy_s"]["pcie"] == pytest.approx(48 * (128 * 9_437_184 / 56.0e9 + 2e-6), rel=1e-9)
    assert missing["lane_busy_s"]["pcie"] < 0.9 * layer["lane_busy_s"]["pcie"]
    assert layer["prefill_tok_s"] < missing["prefill_tok_s"]


def test_prefill_copies_layer_needs_an_offload_prefill(capsys):
    # freetoken-hybrid's own prefill computes some misses on the CPU; a whole layer on the GPU leaves it none
    assert main(["predict", "--model", "qwen3-30b-a3b", "--hardware", "rtx5090-ryzen", "--engine", "freetoken-hybrid",
                 "--prefill-copies", "layer", "--no-band"]) == 2
    err = capsys.readouterr().err
    assert "prefill_copies layer" in err and "prefill_split offload" in err and "Traceback" not in err
