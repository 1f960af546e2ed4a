"""`ft trace import / info / synth` end to end: files written, JSON that agrees with the library, clear errors."""

import json

import numpy as np
import pytest

from freetoken.cli import main
from freetoken.paths import DEFAULT_TRACE, SHIPPED_TRACES
from freetoken.trace import load
from freetoken.trace.stats import popularity_skew
from freetoken.sim.reuse import reuse_stats
from freetoken.sim.synth import SynthSpec, synthesize


def _mixtral_log(path, tokens=5, layers=4, missing=((4, 2),)):
    """A tiny Mixtral log: token 4 lacks layer 2, so 4 of 5 tokens are complete."""
    rng = np.random.default_rng(0)
    rows = []
    for layer in range(layers):
        for t in range(tokens):
            if (t, layer) in missing:
                continue
            e = rng.choice(8, 2, replace=False).tolist()
            rows.append({"dataset": "d", "problem_id": 3, "layer": layer, "experts": e,
                         "gating_probs": [0.7, 0.3], "token_idx": t})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, rows


def test_import_writes_the_trace_and_reports_dropped_tokens(tmp_path, capsys):
    src, rows = _mixtral_log(tmp_path / "log.jsonl")
    out = tmp_path / "t.safetensors"
    assert main(["trace", "import", str(src), str(out), "--model", "mixtral-test"]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}: 4 tokens" in text and "dropped 1 tokens" in text
    trace = load(out)
    assert trace.experts.shape == (4, 4, 2) and trace.model == "mixtral-test"
    first = next(r for r in rows if r["layer"] == 3 and r["token_idx"] == 1)
    assert trace.experts[1, 3].tolist() == first["experts"]
    assert trace.extra["dropped_tokens"] == "1"


def test_import_incomplete_error_is_exit_2_naming_the_token(tmp_path, capsys):
    src, _ = _mixtral_log(tmp_path / "log.jsonl")
    assert main(["trace", "import", str(src), str(tmp_path / "t.safetensors"), "--incomplete", "error"]) == 2
    err = capsys.readouterr().err
    assert "problem d/3 token 4 lacks layers [2]" in err and "Traceback" not in err
    assert not (tmp_path / "t.safetensors").exists()


def test_import_real_trace(shared_traces, tmp_path, capsys):
    out = tmp_path / "g.safetensors"
    assert main(["trace", "import", str(shared_traces / "mixtral-8x7b" / "gsm8k_2_routing.jsonl"), str(out)]) == 0
    text = capsys.readouterr().out
    assert "244 tokens" in text and "dropped 3 tokens: tokens without exactly one row for each of the 32" in text
    assert load(out).num_tokens == 244


def test_info_json_agrees_with_the_library(tmp_path, capsys):
    path = tmp_path / "s.safetensors"
    from freetoken.trace import save

    trace = synthesize(SynthSpec(6, 16, 2, 300, num_requests=3, prefill_share=0.4, skew=0.8, reuse=0.3))
    save(trace, path)
    assert main(["trace", "info", str(path), "--json", "--prefill-chunk", "16"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["tokens"], info["requests"], info["layers"], info["experts"], info["top_k"]) == (300, 3, 6, 16, 2)
    assert info["phases"] == {"prefill": 120, "decode": 180}  # 100 tokens a request, 40 of them prefill
    assert info["skew"]["gini"]["mean"] == pytest.approx(popularity_skew(trace).gini.mean())
    assert info["reuse_token"] == reuse_stats(trace, 1).to_dict()
    assert info["reuse_calls"]["p90"] == reuse_stats(trace, 16).percentiles[90]
    assert main(["trace", "info", str(path)]) == 0
    assert "Gini" in capsys.readouterr().out


def test_synth_writes_the_asked_shape_deterministically(tmp_path, capsys):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    argv = ["--layers", "5", "--experts", "12", "--top-k", "3", "--tokens", "90", "--requests", "2",
            "--skew", "0.5,0.5,1,1,2", "--reuse", "0.2", "--window", "3", "--seed", "4"]
    assert main(["trace", "synth", str(a)] + argv) == 0
    assert main(["trace", "synth", str(b)] + argv) == 0
    ta, tb = load(a), load(b)
    assert ta.experts.shape == (90, 5, 3) and np.array_equal(ta.experts, tb.experts)
    spec = json.loads(ta.extra["synth_spec"])
    assert spec["skew"] == [0.5, 0.5, 1.0, 1.0, 2.0] and spec["reuse"] == 0.2 and spec["seed"] == 4
    want = synthesize(SynthSpec(5, 12, 3, 90, num_requests=2, skew=(0.5, 0.5, 1, 1, 2), reuse=0.2, window=3,
                                seed=4))
    assert np.array_equal(ta.experts, want.experts)


def test_synth_fit_takes_shape_from_the_trace(tmp_path, capsys):
    from freetoken.trace import save

    real = tmp_path / "real.safetensors"
    save(synthesize(SynthSpec(4, 8, 2, 200, num_requests=2, skew=1.5, reuse=0.5, window=2, seed=1)), real)
    out = tmp_path / "fit.safetensors"
    assert main(["trace", "synth", str(out), "--fit", str(real), "--tokens", "400"]) == 0
    assert "fitted to" in capsys.readouterr().out
    t = load(out)
    assert t.experts.shape == (400, 4, 2)
    assert abs(popularity_skew(t).gini.mean() - popularity_skew(load(real)).gini.mean()) < 0.05


@pytest.mark.parametrize("argv, message", [
    (["synth", "{out}", "--layers", "4"], "give --experts, --top-k, --tokens"),
    (["synth", "{out}", "--layers", "4", "--experts", "4", "--top-k", "5", "--tokens", "9"],
     "top_k 5 exceeds num_experts 4"),
    (["synth", "{out}", "--layers", "2", "--experts", "4", "--top-k", "1", "--tokens", "9", "--skew", "a,b"],
     "--skew must be a number"),
    (["synth", "{tmp}/x.json", "--layers", "2", "--experts", "4", "--top-k", "1", "--tokens", "9"],
     "must be a .safetensors file"),
    (["import", "{tmp}/none.jsonl", "{out}"], "{tmp}/none.jsonl: no such trace file"),
    (["import", "{tmp}", "{out}", "--format", "granite_json"], "{tmp}: is a folder, not a trace file"),
    (["import", "{tmp}/odd.txt", "{out}"], "cannot tell the routing-log format"),
    (["import", "{tmp}/odd.txt", "{out}", "--format", "granite_json"], "not valid JSON"),
    (["import", "{tmp}/odd.txt", "{out}", "--format", "granite_json", "--incomplete", "drop"],
     "--incomplete applies to the mixtral_jsonl format"),
    (["synth", "{out}", "--layers", "2", "--experts", "40000", "--top-k", "2", "--tokens", "9"],
     "num_experts 40000 exceeds 32768: a trace holds expert ids as int16"),
    (["info", "{tmp}/none.safetensors"], "no such trace file"),
    (["info", str(DEFAULT_TRACE), "--prefill-chunk", "0"], "--prefill-chunk must be a positive number of tokens"),
    (["info", str(DEFAULT_TRACE), "--prefill-chunk", str(2**64)],  # was numba's overflow traceback
     f"--prefill-chunk must be a positive number of tokens, at most 2147483647, got {2**64}"),
    (["info", "{tmp}"], "{tmp}: is a folder, not a trace file"),
    (["info", "/dev/null"], "/dev/null: not a regular file"),  # (was: no such trace file)
])
def test_bad_input_is_exit_2_with_one_clear_line(tmp_path, capsys, argv, message):
    (tmp_path / "odd.txt").write_text("hello\n")
    argv = [a.format(tmp=tmp_path, out=tmp_path / "o.safetensors") for a in argv]
    assert main(["trace"] + argv) == 2
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path) in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_shipped_traces_load_and_stay_small():
    for name, limit, shape in [("synthetic-32x8-top2.safetensors", 1 << 20, (32, 8, 2)),
                               ("synthetic-48x128-top8.safetensors", 3 << 20, (48, 128, 8))]:
        path = SHIPPED_TRACES / name
        t = load(path)
        assert path.stat().st_size < limit
        assert (t.num_layers, t.num_experts, t.top_k) == shape
        assert set(np.unique(t.phase).tolist()) == {0, 1} and 2 <= len(np.unique(t.request)) <= 4
    assert DEFAULT_TRACE == SHIPPED_TRACES / "synthetic-32x8-top2.safetensors"


def test_shipped_traces_regenerate_from_the_commands_in_their_readme(tmp_path, capsys):
    import shlex

    commands = [line.strip() for line in (SHIPPED_TRACES / "README.md").read_text().splitlines()
                if line.strip().startswith("ft trace synth traces/")]
    assert len(commands) == 2
    for command in commands:
        argv = shlex.split(command)[1:]
        shipped = SHIPPED_TRACES / argv[2].removeprefix("traces/")
        argv[2] = str(tmp_path / shipped.name)
        assert main(argv) == 0
        a, b = load(shipped), load(argv[2])
        assert np.array_equal(a.experts, b.experts) and np.array_equal(a.phase, b.phase)
        assert a.extra == b.extra and a.model == b.model


def test_synth_and_shipped_traces_are_byte_identical_on_rebuild(tmp_path, capsys):
    """The header's keys are written sorted: two writes in this process, one in a fresh process (another hash seed)
    and the shipped files rebuilt from their README commands are the same bytes."""
    import shlex
    import subprocess
    import sys

    argv = ["--layers", "3", "--experts", "6", "--top-k", "2", "--tokens", "40", "--seed", "2"]
    paths = [tmp_path / f"{i}.safetensors" for i in range(3)]
    for p in paths[:2]:
        assert main(["trace", "synth", str(p)] + argv) == 0
    code = "import sys; from freetoken.cli import main; sys.exit(main(sys.argv[1:]))"
    subprocess.run([sys.executable, "-c", code, "trace", "synth", str(paths[2])] + argv, check=True,
                   capture_output=True)
    assert paths[0].read_bytes() == paths[1].read_bytes() == paths[2].read_bytes()
    for line in (SHIPPED_TRACES / "README.md").read_text().splitlines():
        if line.strip().startswith("ft trace synth traces/"):
            cmd = shlex.split(line.strip())[1:]
            shipped = SHIPPED_TRACES / cmd[2].removeprefix("traces/")
            cmd[2] = str(tmp_path / shipped.name)
            assert main(cmd) == 0
            assert shipped.read_bytes() == (tmp_path / shipped.name).read_bytes(), shipped.name


def _strict_json(text: str) -> dict:
    def refuse(name):
        raise AssertionError(f"{name} in JSON output")

    return json.loads(text, parse_constant=refuse)


def test_info_on_an_empty_or_never_reused_trace_has_no_made_up_numbers(tmp_path, capsys):
    from freetoken.trace import RoutingTrace, save

    empty = save(RoutingTrace(np.zeros((0, 2, 2), np.int16), 8, model="e", source="t"), tmp_path / "e.safetensors")
    assert main(["trace", "info", str(empty), "--json"]) == 0
    info = _strict_json(capsys.readouterr().out)
    assert info["tokens"] == 0 and info["skew"] is None
    assert info["reuse_token"] == {"accesses": 0, "cold_share": 0.0, "p50": None, "p90": None, "p99": None}
    assert main(["trace", "info", str(empty)]) == 0
    text = capsys.readouterr().out
    assert "no tokens: no popularity or reuse statistics" in text and "nan" not in text and "Gini" not in text
    # one token picking experts {0, 1} and {2, 3}: 2 of 8 experts used equally, Gini (E - n) / E = 6 / 8; no key
    # is used twice, so there is no reuse distance to take percentiles of
    one = save(RoutingTrace(np.array([[[0, 1], [2, 3]]], np.int16), 8, model="o", source="t"),
               tmp_path / "o.safetensors")
    assert main(["trace", "info", str(one), "--json"]) == 0
    info = _strict_json(capsys.readouterr().out)
    assert info["skew"]["gini"] == {"mean": 0.75, "min": 0.75, "max": 0.75}
    assert info["reuse_calls"]["p50"] is None and info["reuse_calls"]["cold_share"] == 1.0
    assert main(["trace", "info", str(one)]) == 0
    text = capsys.readouterr().out
    assert "no key used twice  cold 100.00% of 4 accesses" in text and "nan" not in text


def _lru_misses(trace, capacity: int) -> int:
    """Reference: global LRU over (layer, expert) keys, one call per token and layer (decode); a call's own keys
    are never evicted to admit another of its keys."""
    from collections import OrderedDict

    cache: OrderedDict[int, None] = OrderedDict()
    misses = 0
    E = trace.num_experts
    for t in range(trace.num_tokens):
        for layer in range(trace.num_layers):
            keys = [layer * E + int(e) for e in trace.experts[t, layer]]
            for k in keys:
                if k in cache:
                    cache.move_to_end(k)
            for k in keys:
                if k in cache:
                    continue
                misses += 1
                if len(cache) >= capacity:
                    victim = next(v for v in cache if v not in keys)
                    del cache[victim]
                cache[k] = None
    return misses


def test_mixtral_log_imports_as_decode_and_says_so(shared_traces, tmp_path, capsys):
    """The Mixtral rows are a serving log (one router decision per generated token): imported as decode, the
    default 2048-token prefill chunk no longer folds a problem into one call per layer (511 cold misses); ft sim
    counts what a token-by-token LRU replay counts. --phase prefill is the explicit other choice; both print it."""
    src = shared_traces / "mixtral-8x7b" / "gsm8k_2_routing.jsonl"
    out = tmp_path / "mx.safetensors"
    assert main(["trace", "import", str(src), str(out)]) == 0
    text = capsys.readouterr().out
    assert "244 tokens (0 prefill, 244 decode)" in text and "phase: decode (the format's default" in text
    trace = load(out)
    assert (trace.phase == 1).all() and trace.extra["phase"].startswith("decode (the format's default")
    assert main(["sim", "--trace", str(out), "--capacity", "64", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["misses"] == _lru_misses(trace, 64) == 10_267
    assert main(["trace", "import", str(src), str(out), "--phase", "prefill"]) == 0
    assert "244 tokens (244 prefill, 0 decode)" in capsys.readouterr().out
    assert load(out).extra["phase"] == "prefill (given)"
    from freetoken.trace.importers import import_trace

    with pytest.raises(ValueError, match="phase: unknown 'middle'; valid: prefill, decode"):
        import_trace(src, phase="middle")
    granite = shared_traces / "granite-3.0-1b-a400m" / "moe_expert_trace.json"
    assert main(["trace", "import", str(granite), str(out), "--phase", "decode"]) == 2
    assert "--phase applies to the mixtral_jsonl format" in capsys.readouterr().err


SYNTH = ["--layers", "2", "--experts", "4", "--top-k", "1", "--tokens", "9"]


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_synth_output_under_a_file_names_that_file(tmp_path, capsys):
    (tmp_path / "notes").write_text("mine\n")
    out = tmp_path / "notes" / "t.safetensors"
    assert main(["trace", "synth", str(out)] + SYNTH) == 2
    assert _error_line(capsys) == (f"ft trace synth: error: {out}: cannot write ({tmp_path / 'notes'} is a file, not a "
                                   f"folder)")
    assert (tmp_path / "notes").read_text() == "mine\n"


def test_synth_in_a_folder_it_may_not_write_names_the_output_not_a_temp_file(tmp_path, capsys, monkeypatch):
    import tempfile

    def refuse(prefix, suffix, dir):
        raise PermissionError(13, "Permission denied", f"{dir}/{prefix}abc{suffix}")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    out = tmp_path / "t.safetensors"
    assert main(["trace", "synth", str(out)] + SYNTH) == 2
    assert _error_line(capsys) == f"ft trace synth: error: {out}: cannot write (Permission denied)"


def test_synth_interrupted_write_keeps_the_old_trace_whole_and_leaves_no_temp_file(tmp_path, capsys, monkeypatch):
    import errno

    import safetensors.numpy

    out = tmp_path / "t.safetensors"
    assert main(["trace", "synth", str(out)] + SYNTH) == 0
    before = out.read_bytes()

    def disk_full(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"half a header")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.numpy, "save_file", disk_full)
    assert main(["trace", "synth", str(out), "--seed", "5"] + SYNTH) == 2
    assert _error_line(capsys) == f"ft trace synth: error: {out}: cannot write (No space left on device)"
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["t.safetensors"]


def test_running_out_of_memory_is_one_line(tmp_path, capsys, monkeypatch):
    import freetoken.sim.synth

    def too_big(spec):
        raise MemoryError("Unable to allocate 745. GiB for an array with shape (4, 25000000000, 2, 2)")

    monkeypatch.setattr(freetoken.sim.synth, "synthesize", too_big)
    assert main(["trace", "synth", str(tmp_path / "t.safetensors")] + SYNTH) == 2
    assert _error_line(capsys) == ("ft trace synth: error: out of memory: Unable to allocate 745. GiB for an array "
                                   "with shape (4, 25000000000, 2, 2); ask for less")


def test_deepseek_npz_that_is_not_a_zip_is_named(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.arange(3))  # one array, not an archive: was a TypeError traceback
    (tmp_path / "a.npy").rename(tmp_path / "a.npz")
    (tmp_path / "b.npz").write_text("hello\n")  # was numpy's advice about pickled data
    for name in ("a.npz", "b.npz"):
        assert main(["trace", "import", str(tmp_path / name), str(tmp_path / "o.safetensors"), "--format",
                     "deepseek_npz"]) == 2
        assert _error_line(capsys) == (f"ft trace import: error: {tmp_path / name}: not a .npz archive (not a zip "
                                       f"file; a .npz holds experts, offsets, prompt_ids)")
