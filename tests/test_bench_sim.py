import pytest
"""`ft bench sim` end to end on a tiny trace: its miss counts are real (checked against each other and against
a replay written out here), its curve agrees with its replays, and bad input fails in one line. No timing asserts:
speed targets live in the benchmark's printed ratios."""

import json

import numpy as np

from freetoken.cli import main
from freetoken.placement import LRU, Split
from freetoken.trace import DECODE, RoutingTrace, save
from freetoken.sim.calls import trace_calls
from freetoken.sim.replay import replay


def _top1_decode(tmp_path):
    rng = np.random.default_rng(7)
    T, L, E = 300, 3, 8
    ex = rng.choice(E, size=(T, L, 1), p=np.array([8, 6, 4, 3, 2, 1, 1, 1]) / 26).astype(np.int16)
    trace = RoutingTrace(ex, E, model="tiny", source="test", phase=np.full(T, DECODE, np.int8))
    return save(trace, tmp_path / "top1.safetensors"), trace


@pytest.mark.slow
def test_bench_json_counts_agree(tmp_path, capsys):
    path, trace = _top1_decode(tmp_path)
    assert main(["bench", "sim", "--trace", str(path), "--capacities", "4", "--repeat", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    capacity = round(0.25 * trace.num_keys)  # 6 of 24 slots
    assert out["capacity"] == capacity and out["accesses"] == 300 * 3
    want = replay(list(trace_calls(trace)), LRU(capacity, 3, 8), Split()).total.misses
    # top-1, one call per token and layer: one model, so all three paths count the same misses
    assert out["ours"]["misses"] == out["libcachesim"]["misses"] == out["libcachesim_per_request"]["misses"] == want
    assert out["mrc"]["agrees_with_replays"] is True and out["mrc"]["capacities"] == 4
    assert out["ours_vs_libcachesim"] == out["libcachesim"]["seconds"] / out["ours"]["seconds"]


@pytest.mark.slow
def test_bench_prints_both_ratios(tmp_path, capsys):
    path, _ = _top1_decode(tmp_path)
    assert main(["bench", "sim", "--trace", str(path), "--capacities", "3", "--repeat", "1",
                 "--no-per-request"]) == 0
    text = capsys.readouterr().out
    assert "ratio replay speed ours / libcachesim:" in text and "ratio 3 replays / one-pass MRC:" in text


def test_bench_bad_input_is_one_line(tmp_path, capsys):
    assert main(["bench", "sim", "--trace", str(tmp_path / "nope.safetensors")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ft bench sim: error: --trace {tmp_path / 'nope.safetensors'}: no such trace file"]
    path, _ = _top1_decode(tmp_path)
    assert main(["bench", "sim", "--trace", str(path), "--fraction", "1.5"]) == 2
    assert "--fraction" in capsys.readouterr().err


def test_bench_race_on_more_traces(tmp_path, capsys):
    path, trace = _top1_decode(tmp_path)
    other = save(trace.select(np.arange(trace.num_tokens) < 200), tmp_path / "head.safetensors")
    assert main(["bench", "sim", "--trace", str(path), "--capacities", "2", "--repeat", "1", "--no-per-request",
                 "--policies", "lru", "--race", str(other), "--min-seconds", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    race = out["races"][str(other)]
    want = replay(list(trace_calls(trace.select(np.arange(300) < 200))), LRU(race["capacity"], 3, 8), Split())
    assert race["accesses"] == 200 * 3 and race["capacity"] == out["capacity"]
    for mode in ("", "interleaved_"):  # both timings count the same misses on each side, and the loop alone too
        for side in ("ours", "ours_loop", "ours_from_trace", "plain", "libcachesim", "libcachesim_writing"):
            assert race[f"{mode}{side}"]["misses"] == want.total.misses
            assert out[f"{mode}{side}"]["misses"] == out["ours"]["misses"]
        for other in ("libcachesim", "plain"):
            assert race[f"{mode}ours_vs_{other}"] == race[f"{mode}{other}"]["seconds"] / race[f"{mode}ours"]["seconds"]
    assert main(["bench", "sim", "--trace", str(path), "--race", str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ft bench sim: error: --race {tmp_path / 'nope.jsonl'}: no such trace file"]
    assert main(["bench", "sim", "--trace", str(path), "--race", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"ft bench sim: error: --race {tmp_path}: is a folder, not a trace file"
    assert main(["bench", "sim", "--trace", str(path), "--min-seconds", "-1"]) == 2
    assert "--min-seconds" in capsys.readouterr().err


def test_race_all_takes_shipped_traces_and_every_routing_log(tmp_path, monkeypatch):
    from freetoken.cli.bench_sim import every_trace
    from freetoken.paths import SHIPPED_TRACES

    log = tmp_path / "m" / "run.jsonl"
    log.parent.mkdir()
    log.write_text("".join(json.dumps({"dataset": "d", "problem_id": 0, "layer": layer, "experts": [0, 1],
                                       "gating_probs": [0.5, 0.5], "token_idx": t}) + "\n"
                           for t in range(2) for layer in range(2)))
    (tmp_path / "README.md").write_text("# not a trace\n")
    (tmp_path / "m" / "counts.json").write_text('{"layer_0": [1, 2]}')
    monkeypatch.setenv("FT_SHARED_TRACES", str(tmp_path))
    shipped = sorted(SHIPPED_TRACES.glob("*.safetensors"))
    assert shipped and every_trace() == [*shipped, log]
