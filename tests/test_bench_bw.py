"""ft bench bw: a valid profile from a real (quick) run; the recommendation rule on hand-derived numbers."""

from __future__ import annotations

import json

import pytest
import torch

from freetoken.calibrate.lanes import Geometry
from freetoken.calibrate.measure import last_level_cache_bytes
from freetoken.calibrate.mode import recommend, resolve_split
from freetoken.calibrate.profile import load_profile, profile_path, save_profile
from freetoken.cli import main


pytestmark = pytest.mark.usefixtures("threads_restored")  # --threads sets them for the process


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One real `ft bench bw --quick --json --threads 1` run (a few seconds), shared by the checks below."""
    cache = tmp_path_factory.mktemp("cache")
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", "bw", "--quick", "--json", "--threads", "1", "--cache-dir", str(cache)]) == 0
    return json.loads(out.getvalue()), cache


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only report")
def test_quick_run_writes_a_valid_cpu_profile(quick_run):
    printed, cache = quick_run
    path = profile_path(None, "bf16", cache)
    assert printed["path"] == str(path)
    profile = load_profile(path)  # validates every required field
    assert profile["key"] == "cpu|bf16" and profile["gpu"] is None
    assert profile["pcie"] is None and profile["overlap"] is None
    assert profile["recommendation"]["mode"] == "cpu"
    assert "PCIe absent" in profile["recommendation"]["reason"]
    # the buffer is beyond the last-level cache, and the expert is Qwen3-30B-A3B's: 3 * 2048 * 768 * 2 bytes
    assert profile["host"]["buffer_bytes"] >= 4 * last_level_cache_bytes()
    # the CPU lane runs 4 experts (--misses-per-call) per MoE layer call, through the engine's host path
    assert profile["cpu_lane"]["experts_per_call"] == 4 and profile["cpu_lane"]["function"].startswith("engine")
    assert profile["cpu_lane"]["bytes_per_pass"] == 4 * 9_437_184
    assert profile["cpu_lane"]["experts_in_pool"] * 9_437_184 >= profile["host"]["buffer_bytes"]
    assert profile["repeats"] == 3 and profile["threads"] == profile["host_kernel_threads"] == 1  # --threads 1
    for lane in ("host", "cpu_lane"):
        r = profile[lane]
        assert r["repeats"] == len(r["readings"]) == 3
        for x in r["readings"]:  # each reading sustained = all bytes over all seconds (rounded when written)
            assert x["gb_s"] == pytest.approx(x["passes"] * x["bytes_per_pass"] / x["seconds"] / 1e9, rel=0.01)
            assert x["passes"] >= 3 and x["seconds"] >= 0.25 * 0.99
        rates = sorted(x["gb_s"] for x in r["readings"])
        assert r["gb_s"] == r["median_gb_s"] == rates[1] and (r["min_gb_s"], r["max_gb_s"]) == (rates[0], rates[2])
        assert r["spread"] == pytest.approx((rates[2] - rates[0]) / rates[1], abs=1e-3)
        assert r["gb_s"] <= r["peak_gb_s"]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only report")
def test_table_says_pcie_is_absent(tmp_path, capsys):
    assert main(["bench", "bw", "--quick", "--seconds", "0.2", "--threads", "1", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "host memory read" in out and "CPU lane, 4 experts/call" in out and "3 readings per lane" in out
    assert "1 threads (host kernels 1)" in out
    assert "absent (no CUDA device)" in out and "recommended mode: cpu" in out


def test_offload_when_the_balanced_split_fetches_every_miss():
    # q in {3, 4}: cost(3) = max(3/45, 1/10) = 0.1 > cost(4) = 4/45 = 0.089, so all 4 are fetched
    rec = recommend(dma_alone=50.0, cpu_overlap=10.0, dma_overlap=45.0, misses_per_call=4, probe=None)
    assert rec["mode"] == "offload" and rec["fetched_per_call"] == 4
    assert rec["predicted_speedup"] == pytest.approx((4 / 50) / (4 / 45), abs=1e-3)


def test_hybrid_only_when_the_decode_probe_confirms_it():
    # q in {0, 1}: cost(0) = 4/40 = 0.1, cost(1) = max(1/10, 3/40) = 0.1, tie -> q = 0;
    # offload 4/12 = 0.333 per call, so predicted 3.33x
    args = dict(dma_alone=12.0, cpu_overlap=40.0, dma_overlap=10.0, misses_per_call=4)
    unchecked = recommend(**args, probe=None)
    assert unchecked["mode"] == "offload" and unchecked["predicted_speedup"] == pytest.approx(3.333, abs=1e-3)
    assert "not checked end to end" in unchecked["reason"]
    slower = recommend(**args, probe={"offload_tok_s": 10.0, "hybrid_tok_s": 10.5})
    assert slower["mode"] == "offload" and slower["measured_speedup"] == 1.05
    faster = recommend(**args, probe={"offload_tok_s": 10.0, "hybrid_tok_s": 20.0})
    assert faster["mode"] == "hybrid" and (faster["bp_gb_s"], faster["bh_gb_s"]) == (10.0, 40.0)


def _lane(gb_s: float) -> dict:
    from freetoken.calibrate.measure import Rate
    from freetoken.calibrate.repeat import Repeated

    return Repeated((Rate(gb_s, gb_s, 1.0, 3, 1000),) * 3).to_dict()


def _profile(mode, bp=None, bh=None):
    return {"version": 2, "key": "GPU X|bf16", "gpu": "GPU X", "expert_format": "bf16", "threads": 8, "repeats": 3,
            "geometry": {"hidden": 2048, "intermediate": 768}, "host": _lane(60.0), "cpu_lane": _lane(30.0),
            "recommendation": {"mode": mode, "bp_gb_s": bp, "bh_gb_s": bh, "reason": "test"}}


def test_auto_resolves_to_offload_unless_the_profile_recommends_hybrid(tmp_path):
    assert resolve_split("auto", "GPU X", "bf16", tmp_path).split.mode == "offload"  # no profile
    with pytest.raises(ValueError, match="run `ft bench bw`"):
        resolve_split("hybrid", "GPU X", "bf16", tmp_path)
    save_profile(_profile("offload", 50.0, 20.0), profile_path("GPU X", "bf16", tmp_path))
    assert resolve_split("auto", "GPU X", "bf16", tmp_path).split.mode == "offload"
    forced = resolve_split("hybrid", "GPU X", "bf16", tmp_path).split
    assert (forced.mode, forced.bp, forced.bh) == ("hybrid", 50.0, 20.0)
    save_profile(_profile("hybrid", 50.0, 20.0), profile_path("GPU X", "bf16", tmp_path))
    auto = resolve_split("auto", "GPU X", "bf16", tmp_path).split
    assert (auto.mode, auto.rule, auto.bp, auto.bh) == ("hybrid", "balanced", 50.0, 20.0)
    # another format on the same GPU has no profile yet
    assert resolve_split("auto", "GPU X", "fp32", tmp_path).split.mode == "offload"
    assert resolve_split("cpu", None, "bf16", tmp_path).split.mode == "cpu"


def test_broken_profiles_are_named(tmp_path):
    path = profile_path("GPU X", "bf16", tmp_path)
    path.write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        resolve_split("auto", "GPU X", "bf16", tmp_path)
    bad = _profile("hybrid")  # hybrid without rates
    with pytest.raises(ValueError, match="bp_gb_s"):
        save_profile(bad, path)
    path.write_text(json.dumps({**_profile("offload"), "host": {**_lane(1.0), "gb_s": -1}}))
    with pytest.raises(ValueError, match=r"host\.gb_s"):
        load_profile(path)


def test_decode_probe_runs_both_splits_on_the_engine():
    # tiny geometry on the CPU: checks the probe drives the real engine in both modes, not the timing
    from freetoken.calibrate.probe import ProbeModel, decode_probe

    out = decode_probe(10.0, 10.0, ProbeModel(Geometry(64, 32, "fp32"), layers=2, experts=8, top_k=2, tokens=4),
                       device="cpu")
    off, hyb = out["offload_counters"], out["hybrid_counters"]
    assert off["cpu"] == 0 and off["fetched"] > 0  # offload fetches every miss
    assert hyb["cpu"] > 0  # equal rates: the balanced split runs about half the misses on the CPU lane
    assert out["same_tokens"]  # the split moves work between lanes; the greedy tokens stay the same
    # ... so both runs routed alike: the same expert accesses, split differently between hit, fetch and CPU
    assert off["hits"] + off["fetched"] == hyb["hits"] + hyb["fetched"] + hyb["cpu"]
    assert out["offload_tok_s"] > 0 and out["hybrid_tok_s"] > 0


def test_bad_counts_are_refused(capsys):
    for flag in ("--repeats", "--threads", "--seconds", "--misses-per-call"):
        assert main(["bench", "bw", "--quick", "--no-save", flag, "0"]) == 2
        assert capsys.readouterr().err == f"ft bench bw: error: {flag} must be positive, got 0\n"


def test_bad_geometry_is_refused(capsys):
    assert main(["bench", "bw", "--quick", "--format", "int3", "--no-save"]) == 2
    assert "expert format 'int3'" in capsys.readouterr().err
    assert main(["bench", "bw", "--quick", "--hidden", "0", "--no-save"]) == 2  # 0 was taken as "the default"
    assert capsys.readouterr().err == "ft bench bw: error: expert geometry must be positive, got D=0, I=768\n"
    with pytest.raises(ValueError, match="positive"):
        Geometry(0, 768)


def test_model_flag_writes_the_profile_serve_reads(tmp_path, capsys):
    """`ft bench bw --model DIR` measures DIR's expert geometry and format, and writes the file that the server's
    `--split auto` looks up for that checkpoint (the demo's fp32 experts, not the bf16 default)."""
    from freetoken.models.checkpoint import load_checkpoint
    from freetoken.paths import DEMO_MODEL
    from freetoken.serve.engine_backend import expert_format

    assert main(["bench", "bw", "--model", str(DEMO_MODEL), "--quick", "--no-probe", "--seconds", "0.05",
                 "--threads", "1", "--cache-dir", str(tmp_path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    fmt = expert_format(load_checkpoint(DEMO_MODEL))
    assert fmt == "fp32" and printed["path"] == str(profile_path(None, fmt, tmp_path))
    assert printed["geometry"]["hidden"] == 64 and printed["geometry"]["intermediate"] == 32
    resolved = resolve_split("auto", None, fmt, tmp_path)
    assert "no bandwidth profile" not in resolved.reason and "profile says cpu" in resolved.reason


def test_model_flag_excludes_geometry_flags(capsys):
    from freetoken.paths import DEMO_MODEL

    assert main(["bench", "bw", "--model", str(DEMO_MODEL), "--hidden", "64", "--no-save"]) == 2
    assert "--model sets the expert geometry" in capsys.readouterr().err


def test_a_slow_lane_keeps_a_positive_rate_in_the_profile():
    """A tiny model's experts on a loaded machine move well under 1 MB/s; rounding to a fixed number of decimals
    wrote 0.0, which the profile validator (rightly) refuses."""
    from freetoken.calibrate.measure import Rate

    rate = Rate(gb_s=2.5e-4, peak_gb_s=4.0e-4, seconds=1.0, passes=3, bytes_per_pass=1000)
    assert rate.to_dict()["gb_s"] == 2.5e-4
    assert rate.to_dict()["peak_gb_s"] == 4.0e-4


def test_a_cache_dir_that_is_a_file_is_named_before_measuring(tmp_path, capsys):
    (tmp_path / "cache").write_text("mine\n")
    for cache, why in ((tmp_path / "cache", "it is a file"),
                       (tmp_path / "cache" / "sub", f"{tmp_path / 'cache'} is a file, not a folder")):
        assert main(["bench", "bw", "--quick", "--cache-dir", str(cache)]) == 2
        assert capsys.readouterr().err == f"ft bench bw: error: --cache-dir {cache}: cannot write ({why})\n"
    assert (tmp_path / "cache").read_text() == "mine\n"
