"""`ft sim` end to end on a saved trace: JSON fields, breakdowns that add up, clear errors."""

import json

import numpy as np
import pytest

from freetoken.cli import main
from freetoken.placement import Split
from freetoken.trace import RoutingTrace, load, save
from freetoken.sim.run import SimConfig, simulate


@pytest.fixture()
def trace_file(tmp_path):
    rng = np.random.default_rng(3)
    T, L, E, K = 60, 4, 8, 2
    ex = np.argsort(rng.random((T, L, E)), axis=2)[:, :, :K].astype(np.int16)
    request = np.repeat(np.arange(3, dtype=np.int32), 20)
    phase = np.tile(np.array([0] * 8 + [1] * 12, np.int8), 3)
    path = tmp_path / "t.safetensors"
    save(RoutingTrace(ex, E, model="tiny", source="test", request=request, phase=phase), path)
    return path


def test_json_has_the_counts_and_they_add_up(trace_file, capsys):
    assert main(["sim", "--trace", str(trace_file), "--policy", "lru", "--capacity", "10", "--prefill-chunk", "4",
                 "--expert-bytes", "100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("hits", "misses", "fetched", "cpu", "evictions", "hit_rate", "fetched_bytes"):
        assert key in out
    assert out["hits"] + out["misses"] == out["accesses"]
    assert out["fetched_bytes"] == 100 * out["fetched"]
    for part in ("phases", "requests"):
        for key in ("hits", "misses", "fetched", "evictions"):
            assert sum(v[key] for v in out[part].values()) == out[key]
    direct = simulate(load(trace_file), SimConfig("lru", Split("offload"), capacity=10, prefill_chunk=4,
                                                  expert_bytes=100)).total
    assert (out["hits"], out["misses"], out["evictions"]) == (direct.hits, direct.misses, direct.evictions)
    # decode accesses: 3 requests x 12 tokens x 4 layers x top-2
    assert out["phases"]["decode"]["accesses"] == 3 * 12 * 4 * 2


def test_hybrid_split_moves_work_to_cpu(trace_file, capsys):
    main(["sim", "--trace", str(trace_file), "--capacity", "10", "--split", "hybrid", "--bp", "10", "--bh", "10",
          "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["cpu"] > 0 and out["fetched"] > 0 and out["split"] == "hybrid-balanced"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--trace", "/nonexistent.safetensors", "--capacity", "4"], "no such trace file"),
        (["--fraction", "1.5"], "fraction must lie in (0, 1]"),
        (["--capacity", "999"], "capacity 999 exceeds"),
        (["--split", "hybrid", "--capacity", "4"], "bp > 0"),
        (["--policy", "static_layers", "--capacity", "8", "--n-cpu-layers", "0"],
         "--n-cpu-moe=0 keeps 4 layers resident, which needs 32 expert slots; the cache has 8"),  # 4 layers x 8
        (["--n-cpu-moe", "999"], "--n-cpu-moe must lie in [0, 4] (the MoE layers), got 999"),  # the option's flag
        (["--policy", "frequency", "--capacity", "8", "--scope", "unified"], "frequency scope 'unified' is not one"),
        (["--policy", "lru", "--capacity", "8", "--scope", "global"], "lru scope 'global' is not one"),
    ],
)
def test_bad_input_is_one_clear_line(trace_file, capsys, args, message):
    argv = ["sim"] + (args if "--trace" in args else ["--trace", str(trace_file)] + args)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_corrupt_trace_file_is_named(tmp_path, capsys):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    assert main(["sim", "--trace", str(bad), "--capacity", "1"]) == 2
    assert str(bad) in capsys.readouterr().err


def test_plain_output_shows_prefetched_copies(trace_file, capsys):
    """lookahead prefetches: the plain report prints the prefetched copies (and the transfers they add to the
    misses) the JSON holds, overall and per phase, so a prefetching policy does not look cheaper than it is."""
    argv = ["sim", "--trace", str(trace_file), "--policy", "lookahead", "--capacity", "10", "--prefill-chunk", "4"]
    assert main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prefetched"] > 0
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"prefetched {out['prefetched']}  transfers {out['misses'] + out['prefetched']}" in text
    for name, c in out["phases"].items():
        assert f"fetched {c['fetched']}  prefetched {c['prefetched']}" in text.split(f"  {name}")[1].splitlines()[0]


@pytest.mark.parametrize("extra", [[], ["--max-fetch", "0"]])
def test_max_fetch_rule_without_a_positive_max_fetch_is_refused(trace_file, capsys, extra):
    """Before, --rule max_fetch without --max-fetch fetched nothing: every miss went to the CPU, silently."""
    argv = ["sim", "--trace", str(trace_file), "--capacity", "10", "--split", "hybrid", "--rule", "max_fetch"]
    assert main(argv + extra) == 2
    err = capsys.readouterr().err
    assert "--rule max_fetch needs --max-fetch >= 1, got 0; --split cpu sends every miss to the CPU" in err
    assert len(err.strip().splitlines()) == 1
    assert main(argv + ["--max-fetch", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fetched"] > 0 and out["cpu"] > 0


@pytest.mark.parametrize("argv, options", [
    (["--policy", "frequency", "--strategy", "front_loading"], {"strategy": "front_loading"}),
    (["--policy", "lru", "--scope", "per_layer", "--pool-split", "profile"],
     {"scope": "per_layer", "split": "profile"}),
    (["--policy", "ktransformers_dynamic", "--strategy", "frequency"], {"strategy": "frequency"}),
    (["--policy", "moe_infinity"], {}),
])
def test_new_policy_options_reach_the_policy(trace_file, capsys, argv, options):
    """The CLI's counts equal simulate() given the same options and the same profile trace."""
    assert main(["sim", "--trace", str(trace_file), "--capacity", "10", "--prefill-chunk", "4", "--profile",
                 str(trace_file), "--json"] + argv) == 0
    out = json.loads(capsys.readouterr().out)
    trace = load(trace_file)
    direct = simulate(trace, SimConfig(argv[1], Split("offload"), capacity=10, prefill_chunk=4, options=options),
                      profile=trace).total
    assert (out["hits"], out["misses"], out["prefetched"]) == (direct.hits, direct.misses, direct.prefetched)


@pytest.mark.parametrize("flags, builder", [(["--draft-depth", "2", "--acceptance", "0.5"], "speculative_steps"),
                                            (["--batch", "2"], "batched_steps")])
def test_scenario_call_stream_is_built_once_and_replays_as_simulate(trace_file, capsys, monkeypatch, flags, builder):
    """ft sim --draft-depth / --batch builds its call stream once (counted for the progress bar, then replayed) and
    its counts are simulate()'s building the stream itself."""
    import freetoken.sim.continuous as continuous
    import freetoken.sim.speculative as speculative

    module = speculative if builder == "speculative_steps" else continuous
    built, original = [], getattr(module, builder)
    monkeypatch.setattr(module, builder, lambda *a, **k: built.append(1) or original(*a, **k))
    assert main(["sim", "--trace", str(trace_file), "--capacity", "10", "--prefill-chunk", "4", *flags]) == 0
    plain = capsys.readouterr().out
    assert built == [1]  # one build: counted for the progress bar, then replayed
    assert ("speculation: depth 2, acceptance 0.5" in plain) == (builder == "speculative_steps")
    assert main(["sim", "--trace", str(trace_file), "--capacity", "10", "--prefill-chunk", "4", "--json", *flags]) == 0
    out = json.loads(capsys.readouterr().out)
    fields = dict(draft_depth=2, acceptance=0.5) if builder == "speculative_steps" else dict(batch=2)
    direct = simulate(load(trace_file), SimConfig("lru", Split("offload"), capacity=10, prefill_chunk=4, **fields))
    assert (out["hits"], out["misses"], out["evictions"]) == (direct.total.hits, direct.total.misses,
                                                             direct.total.evictions)
    assert len(built) == 3  # the second CLI run once more, simulate() once


def test_interpreted_options_are_noted_and_replay_the_reference(trace_file, capsys):
    """hinted_sweep measure=true runs the interpreted class: ft sim says so, and its counts are simulate()'s."""
    args = ["sim", "--trace", str(trace_file), "--policy", "hinted_sweep", "--capacity", "10", "--prefill-chunk", "4",
            "--policy-option", "measure=true"]
    assert main(args) == 0
    assert "note: policy hinted_sweep: these options run interpreted (slow path)" in capsys.readouterr().out
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    direct = simulate(load(trace_file), SimConfig("hinted_sweep", Split("offload"), capacity=10, prefill_chunk=4,
                                                  options={"measure": True})).total
    assert (out["misses"], out["prefetched"]) == (direct.misses, direct.prefetched)


@pytest.mark.parametrize("batch, builder", [(1, "speculative_steps"), (2, "batched_steps")])
def test_carried_drafts_are_drawn_once_and_replay_as_the_reference(trace_file, capsys, monkeypatch, batch, builder):
    """ft sim carry=drafts draws the speculative steps once (the progress bar's count, the replay and the carry all
    read that draw), and its counts are the Python reference's on the verify calls of the same draw, told the
    rejected drafts built by sim.carry."""
    import freetoken.sim.continuous as continuous
    import freetoken.sim.speculative as speculative
    from freetoken.placement import make_policy
    from freetoken.sim.batch import Speculation
    from freetoken.sim.calls import steps_stream
    from freetoken.sim.carry import carry_stream
    from freetoken.sim.replay import replay

    module = speculative if builder == "speculative_steps" else continuous
    draws, original = [], getattr(module, builder)
    monkeypatch.setattr(module, builder, lambda *a, **k: draws.append(1) or original(*a, **k))
    assert main(["sim", "--trace", str(trace_file), "--policy", "lookahead", "--capacity", "10", "--prefill-chunk",
                 "4", "--draft-depth", "2", "--acceptance", "0.5", "--draft-seed", "1", "--batch", str(batch),
                 "--policy-option", "carry=drafts", "--policy-option", "accuracy=0.7", "--json"]) == 0
    assert draws == [1]
    out = json.loads(capsys.readouterr().out)
    trace = load(trace_file)
    spec = Speculation(2, 0.5)
    steps = original(trace, spec, 4, 1) if batch == 1 else original(trace, batch, 4, spec, 1)
    stream = steps_stream(trace, steps)
    totals = []
    for carry in ({"carry": carry_stream(trace, steps)}, {}):
        ref = make_policy("lookahead", 10, trace.num_layers, trace.num_experts, reference=True, accuracy=0.7,
                          future=stream.key_stream(), **carry)
        t = replay(stream.calls(), ref, Split("offload")).total
        totals.append((t.accesses, t.hits, t.misses, t.prefetched, t.evictions))
    assert (out["accesses"], out["hits"], out["misses"], out["prefetched"], out["evictions"]) == totals[0]
    assert totals[0] != totals[1]  # the carry changes decisions here


@pytest.mark.parametrize("batch", [1, 2])
def test_speculation_stats_count_the_traces_decode_tokens(trace_file, capsys, batch):
    """ft sim --draft-depth reports its verify steps for one sequence and for a batch: every decode token of the
    trace (3 requests x 12) made once, each step one token per sequence plus the drafts it accepted."""
    argv = ["sim", "--trace", str(trace_file), "--capacity", "10", "--prefill-chunk", "4", "--draft-depth", "2",
            "--acceptance", "0.5", "--batch", str(batch)]
    assert main(argv + ["--json"]) == 0
    spec = json.loads(capsys.readouterr().out)["speculation"]
    assert spec["batch"] == batch and spec["decode_tokens"] == 36
    assert spec["accepted_drafts"] > 0 and spec["verify_steps"] < 36
    if batch == 1:
        assert spec["decode_tokens"] == spec["verify_steps"] + spec["accepted_drafts"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"{spec['verify_steps']} verify steps for 36 decode tokens" in text
    assert ("2 sequences a step" in text) == (batch == 2)
