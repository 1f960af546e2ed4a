"""Experiment entry points: sweeps into a results table equal to direct `ft sim` runs, resumable, parallel-safe."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from freetoken.experiments.results import ResultsStore, config_hash
from freetoken.experiments.runner import run_once
from freetoken.cli import main as ft_main

REPO = Path(__file__).resolve().parent.parent
METRICS = ("accesses", "hits", "misses", "fetched", "cpu", "evictions", "hit_rate", "miss_rate", "capacity")


def entry(module: str, *overrides: str, jobs: int = 2, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "FT_JOBS": str(jobs), "HYDRA_FULL_ERROR": "0", **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *overrides], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=240)


def ft_sim_json(capsys, *args: str) -> dict:
    assert ft_main(["sim", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_sweep_2x2_matches_ft_sim_and_resumes(tmp_path, tiny_trace_file, capsys):
    results = tmp_path / "results"
    args = ("-m", "policy=lru,frequency", "cache.fraction=0.25,0.5", f"trace.path={tiny_trace_file}",
            "trace.name=tiny", "sim.prefill_chunk=4", f"results.dir={results}")
    done = entry("experiments.replay", *args)
    assert done.returncode == 0, done.stderr
    table = pd.read_parquet(results / "replay.parquet")
    assert len(table) == 4
    assert set(zip(table["policy.name"], table["cache.fraction"])) == {
        (p, f) for p in ("lru", "frequency") for f in (0.25, 0.5)}
    for col in ("trace.name", "split.mode", "sim.prefill_chunk", "config_hash"):
        assert col in table.columns
    assert (table["trace.name"] == "tiny").all() and (table["sim.prefill_chunk"] == 4).all()
    assert pd.read_csv(results / "replay.csv").shape == table.shape
    for _, row in table.iterrows():
        ref = ft_sim_json(capsys, "--trace", str(tiny_trace_file), "--policy", row["policy.name"], "--fraction",
                          str(row["cache.fraction"]), "--prefill-chunk", "4")
        for m in METRICS:
            assert row[m] == pytest.approx(ref[m]), (row["policy.name"], row["cache.fraction"], m)
        assert row["decode_miss_rate"] == pytest.approx(ref["phases"]["decode"]["miss_rate"])
    stamps = {p: p.stat().st_mtime_ns for p in (results / "runs" / "replay").glob("*.json")}
    assert len(stamps) == 4

    again = entry("experiments.replay", *args)
    assert again.returncode == 0, again.stderr
    log = again.stdout + again.stderr
    assert log.count("skip ") == 4 and "done " not in log
    assert {p: p.stat().st_mtime_ns for p in (results / "runs" / "replay").glob("*.json")} == stamps
    assert len(pd.read_parquet(results / "replay.parquet")) == 4


@pytest.mark.slow
def test_parallel_sweep_jobs_share_the_parents_compile(tmp_path, tiny_trace_file):
    """Cold cache, two parallel jobs per policy: each policy is compiled once, in the parent (CompileFirst), and
    the jobs load it (a job that compiled would announce it on the same stderr)."""
    done = entry("experiments.replay", "-m", "policy=lru,frequency", "cache.fraction=0.25,0.5",
                 f"trace.path={tiny_trace_file}", "trace.name=tiny", "sim.prefill_chunk=4",
                 f"results.dir={tmp_path / 'results'}", env={"FT_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith("compiling ")]
    assert sorted(n.split(" (first use")[0] for n in notes) == [  # each entry point once: the parent's compile
        "compiling lru", "compiling lru's stream replay", "compiling lru's stream replay (cpu, hybrid)",
        "compiling pinned (static_layers, frequency)", "compiling pinned's stream replay (offload)",
        "compiling the call builder"], notes


def test_sweep_policies_are_the_sweeps_or_every_builtin():
    from omegaconf import OmegaConf

    from freetoken.experiments.launchers import sweep_policies
    from freetoken.placement import BUILTIN

    def config(task, policy="lru", **rest):
        return OmegaConf.create({"hydra": {"overrides": {"task": task}}, "policy": {"name": policy}, **rest})

    assert sweep_policies(config(["policy=lru,belady", "cache.fraction=0.1,0.2"])) == ["lru", "belady"]
    assert sweep_policies(config(["cache.fraction=0.1"], policy="s3fifo")) == ["s3fifo"]
    assert sweep_policies(config(["policy=glob(*)"])) == list(BUILTIN)  # a sweep syntax not read here: all
    assert sweep_policies(config([], study={"case": "x"})) == list(BUILTIN)


@pytest.mark.slow
def test_in_process_run_equals_ft_sim_for_every_policy(small_config, tiny_trace_file, capsys):
    from freetoken.experiments.replay import GROUPS, TABLE, compute

    from freetoken.experiments.compose import options

    for policy in options("policy"):  # every option's values are its constructor's defaults, as ft sim uses
        cfg = small_config(f"policy={policy}", "cache=capacity", **{"cache.capacity": 16})
        row = run_once(cfg, TABLE, GROUPS, compute)
        ref = ft_sim_json(capsys, "--trace", str(tiny_trace_file), "--policy", policy, "--capacity", "16")
        assert {m: row[m] for m in METRICS} == pytest.approx({m: ref[m] for m in METRICS}), policy


def test_hybrid_split_row_counts_cpu_work(small_config, tiny_trace_file, capsys):
    from freetoken.experiments.replay import GROUPS, TABLE, compute

    cfg = small_config("split=hybrid", **{"split.bp": 10.0, "split.bh": 30.0, "cache.fraction": 0.25})
    row = run_once(cfg, TABLE, GROUPS, compute)
    ref = ft_sim_json(capsys, "--trace", str(tiny_trace_file), "--fraction", "0.25", "--split", "hybrid", "--bp", "10",
                      "--bh", "30")
    assert (row["fetched"], row["cpu"]) == (ref["fetched"], ref["cpu"]) and row["cpu"] > 0
    assert row["split.mode"] == "hybrid" and row["split.bh"] == 30.0


def _write_runs(args):
    directory, worker = args
    store = ResultsStore(directory)
    for i in range(10):
        key = config_hash("t", {"worker": worker, "i": i})
        store.write_run("t", key, {"config_hash": key, "worker": worker, "i": i, "value": worker * 100 + i},
                        {"turns": [{"turn": 0, "latency_s": 0.5}, {"turn": 1, "latency_s": i}]})
        store.consolidate("t")


def test_parallel_writers_lose_no_row(tmp_path):
    with multiprocessing.get_context("fork").Pool(4) as pool:
        pool.map(_write_runs, [(tmp_path, w) for w in range(4)])
    table = pd.read_parquet(tmp_path / "t.parquet")
    assert sorted(table["value"]) == sorted(w * 100 + i for w in range(4) for i in range(10))
    turns = pd.read_parquet(tmp_path / "t_turns.parquet")
    assert len(turns) == 80 and set(turns["config_hash"]) == set(table["config_hash"])
    assert not list(tmp_path.rglob("*.tmp"))  # atomic writes leave no partial files


@pytest.mark.parametrize("text, why", [
    ('{"rows": 1}', "an object with a 'row' object"),  # was a KeyError traceback
    ("{bad", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
])
def test_a_hand_edited_run_file_is_named_when_read_back(tmp_path, text, why):
    store = ResultsStore(tmp_path)
    store.write_run("t", "k", {"config_hash": "k", "value": 1})
    store.run_path("t", "k").write_text(text)
    message = f"{store.run_path('t', 'k')}: not a results record ({why}); delete it to rerun its config"
    for read in (lambda: store.read_run("t", "k"), lambda: store.consolidate("t")):
        with pytest.raises(ValueError) as err:
            read()
        assert str(err.value) == message
    assert not (tmp_path / "t.csv").exists()  # no table rebuilt from a broken record


def test_config_hash_ignores_key_order_and_trace_location(small_config, tmp_path):
    from freetoken.experiments.replay import GROUPS
    from freetoken.experiments.runner import UNHASHED, config_columns

    assert config_hash("r", {"a": 1, "b": 2}) == config_hash("r", {"b": 2, "a": 1}) != config_hash("r", {"a": 2, "b": 2})
    a = config_columns(small_config(), GROUPS)
    b = config_columns(small_config(**{"trace.path": "/elsewhere/tiny.safetensors"}), GROUPS)
    strip = lambda c: {k: v for k, v in c.items() if k not in UNHASHED}  # noqa: E731
    assert a != b and config_hash("replay", strip(a)) == config_hash("replay", strip(b))


@pytest.mark.parametrize("overrides, message", [
    (["policy=nope"], "Could not find 'policy/nope'"),
    (["hardware=nope"], "Could not find 'hardware/nope'"),
    (["trace=nope"], "Could not find 'trace/nope'"),
])
def test_unknown_group_option_names_the_group(overrides, message):
    from hydra.errors import HydraException

    from freetoken.experiments.compose import compose

    with pytest.raises(HydraException, match=message.replace("(", r"\(")):
        compose(overrides)


@pytest.mark.parametrize("values, message", [
    ({"cache.fraction": 1.5}, "cache.fraction must lie in (0, 1], got 1.5"),
    ({"cache.fraction": 0.0}, "cache.fraction must lie in (0, 1], got 0.0"),
    ({"cache.capacity": 4}, "give exactly one of cache.fraction or cache.capacity"),
    ({"policy.options.n_cpu_layers": 1}, "policy.options: lru takes no option n_cpu_layers"),
    ({"policy.options.scope": 1}, "policy.options: lru option scope must be a string, got 1"),
    ({"sim.prefill_chunk": 0}, "sim.prefill_chunk must be a positive"),
    ({"split.mode": "gpu"}, "split mode 'gpu'"),
    ({"trace.format": "csv"}, "trace.format: unknown 'csv'"),
])
def test_bad_value_names_the_key(small_config, values, message):
    from freetoken.experiments.replay import validate

    with pytest.raises(ValueError) as err:
        validate(small_config(**values))
    assert message in str(err.value)


def test_cli_bad_value_is_one_line_and_writes_nothing(tmp_path):
    done = entry("experiments.replay", "cache.fraction=1.5", f"results.dir={tmp_path}")
    assert done.returncode == 2
    assert done.stderr.strip() == "experiments.replay: error: cache.fraction must lie in (0, 1], got 1.5"
    assert not (tmp_path / "runs").exists()


def test_policy_option_error_names_its_key(tmp_path, tiny_trace_file):
    """static_layers' range, found when the policy is built on the trace, is spelled as the config key."""
    done = entry("experiments.replay", "policy=static_layers", "policy.options.n_cpu_layers=999",
                 f"trace.path={tiny_trace_file}", "trace.name=tiny", f"results.dir={tmp_path}")
    assert (done.returncode, done.stderr) == (2, "experiments.replay: error: policy.options.n_cpu_layers must lie "
                                                 "in [0, 4] (the MoE layers), got 999\n")  # the trace's 4 layers


def test_results_dir_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "results").write_text("mine\n")
    for value, why in ((tmp_path / "results", "it is a file"),
                       (tmp_path / "results" / "sub", f"{tmp_path / 'results'} is a file, not a folder")):
        done = entry("experiments.replay", f"results.dir={value}")  # was Hydra's traceback making its log folder
        assert (done.returncode, done.stderr) == (2, f"experiments.replay: error: results.dir {value}: cannot write "
                                                     f"({why})\n")
    assert (tmp_path / "results").read_text() == "mine\n"


def test_results_dir_from_a_preset_or_an_interpolation_is_checked_as_composed(tmp_path):
    """Not only a results.dir typed on the command line: the value Hydra composes, before it makes its log folder
    there (was Hydra's NotADirectoryError traceback)."""
    (tmp_path / "notes").write_text("mine\n")
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "mine.yaml").write_text(
        f"# @package _global_\nresults:\n  dir: {tmp_path / 'notes'}\n")
    preset = entry("experiments.replay", f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "experiment=mine")
    interpolated = subprocess.run([sys.executable, "-m", "experiments.replay", "results.dir=${oc.env:MINE}/sub"],
                                  cwd=REPO, env={**os.environ, "MINE": str(tmp_path / "notes")}, capture_output=True,
                                  text=True, timeout=240)
    assert (preset.returncode, preset.stderr) == (2, f"experiments.replay: error: results.dir {tmp_path / 'notes'}: "
                                                     f"cannot write (it is a file)\n")
    assert (interpolated.returncode, interpolated.stderr) == (
        2, f"experiments.replay: error: results.dir {tmp_path / 'notes' / 'sub'}: cannot write "
           f"({tmp_path / 'notes'} is a file, not a folder)\n")
    assert (tmp_path / "notes").read_text() == "mine\n"


def test_results_dir_that_cannot_be_made_is_one_line(tmp_path, monkeypatch, capsys):
    import pathlib

    from freetoken.experiments.launchers import check_results_dir

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(pathlib.Path, "mkdir", refuse)  # as a folder this user may not write in
    with pytest.raises(SystemExit) as done:
        check_results_dir("experiments.replay", str(tmp_path / "r"))
    assert done.value.code == 2
    assert capsys.readouterr().err == (f"experiments.replay: error: results.dir {tmp_path / 'r'}: cannot write "
                                       f"(Permission denied)\n")


def test_live_without_engine_says_so(small_config, monkeypatch):
    from freetoken.experiments import live

    monkeypatch.setattr(live, "engine_available", lambda: False)
    with pytest.raises(ValueError, match="engine not available"):
        live.validate(small_config())


def test_live_run_agrees_with_a_replay_of_its_recorded_trace(small_config, capsys):
    from freetoken.experiments import live

    if not live.engine_available():
        pytest.fail("freetoken.engine is part of this build; the live entry point must run")
    cfg = small_config(**{"cache.fraction": 0.5, "live.kernels": "reference", "live.requests": 2,
                          "live.prompt_tokens": 12, "live.decode_tokens": 6, "sim.prefill_chunk": 8})
    row = run_once(cfg, live.TABLE, live.GROUPS, live.compute, live.validate)
    assert row["agree"] and row["live_accesses"] == row["sim_accesses"] > 0
    # independent check: ft sim on the trace the engine recorded, same policy and capacity
    ref = ft_sim_json(capsys, "--trace", row["recorded_trace"], "--policy", "lru", "--fraction", "0.5",
                      "--prefill-chunk", "8")
    assert (row["live_hits"], row["live_fetched"], row["live_evictions"]) == (ref["hits"], ref["fetched"],
                                                                              ref["evictions"])
    assert row["num_tokens"] == 2 * (12 + 6 - 1)  # the last sampled token of each request is never fed back


@pytest.mark.slow
def test_ray_launcher_runs_a_sweep_on_a_local_ray_instance(tmp_path, tiny_trace_file):
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    results = tmp_path / "results"
    done = entry("experiments.replay", "-m", "hydra/launcher=ray_local", "policy=lru,belady",
                 f"trace.path={tiny_trace_file}", "trace.name=tiny", f"results.dir={results}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Ray Launcher is launching 2 jobs" in done.stdout + done.stderr
    table = pd.read_parquet(results / "replay.parquet")
    assert sorted(table["policy.name"]) == ["belady", "lru"]
    lru, belady = (table.set_index("policy.name").loc[p, "misses"] for p in ("lru", "belady"))
    assert belady <= lru


def test_a_launcher_whose_plugin_is_missing_is_named_with_its_package(tmp_path, capsys):
    """conf/hydra/launcher/<name>.yaml builds on a Hydra plugin config; when the plugin's module is absent the entry
    point names the package in one line before Hydra's "could not load" message."""
    from freetoken.experiments import launchers

    launcher = tmp_path / "hydra" / "launcher"
    launcher.mkdir(parents=True)
    (launcher / "mine.yaml").write_text("defaults:\n  - submitit_slurm\n\ntimeout_min: 5\n")
    assert launchers.plugin_of("mine", tmp_path) == "submitit_slurm"
    assert launchers.plugin_of("slurm") == "submitit_slurm" and launchers.plugin_of("local") == "joblib"
    assert launchers.missing_packages("local") == []  # hydra-joblib-launcher is a core dependency
    fake = {"submitit_slurm": (("hydra_plugins.no_such_launcher_module", "hydra-submitit-launcher"),)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launchers, "PLUGINS", fake)
        with pytest.raises(SystemExit) as e:
            launchers.check_launcher("experiments.replay", ["-m", "hydra/launcher=mine", "policy=lru"], tmp_path)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err == ("experiments.replay: error: hydra/launcher=mine needs hydra-submitit-launcher, which is not "
                       "installed (pip install hydra-submitit-launcher)\n")
        launchers.check_launcher("experiments.replay", ["-m", "policy=lru"], tmp_path)  # no launcher chosen: fine


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None,
                    reason="hydra-submitit-launcher is installed here")
def test_slurm_launcher_without_submitit_is_one_line_naming_the_package(tmp_path):
    done = subprocess.run([sys.executable, "-m", "experiments.replay", "-m", "hydra/launcher=slurm",
                           f"results.dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ("experiments.replay: error: hydra/launcher=slurm needs hydra-submitit-launcher, "
                                   "which is not installed (pip install hydra-submitit-launcher)")


def test_a_code_version_change_reruns_unless_told_to_reuse(small_config, monkeypatch):
    """The resume key is (config hash, code version): the same config under other code computes again and its row
    says which code made it; results.reuse_other_code=true keeps the old row."""
    import freetoken.experiments.runner as runner
    from freetoken.experiments.replay import GROUPS, TABLE, compute
    from freetoken.version import code_version

    calls = []

    def counted(cfg):
        calls.append(1)
        return compute(cfg)

    cfg = small_config(**{"cache.fraction": 0.5})
    first = run_once(cfg, TABLE, GROUPS, counted)
    assert first["code_version"] == code_version() and first["code_version"].startswith("0.1.0+src.")
    assert run_once(cfg, TABLE, GROUPS, counted) == first and len(calls) == 1  # same code: resumed
    monkeypatch.setattr(runner, "code_version", lambda: "0.1.0+src.000000000000")
    reused = run_once(small_config(**{"cache.fraction": 0.5, "results.reuse_other_code": True}), TABLE, GROUPS,
                      counted)
    assert reused == first and len(calls) == 1
    second = run_once(cfg, TABLE, GROUPS, counted)
    assert len(calls) == 2 and second["code_version"] == "0.1.0+src.000000000000"
    assert second["config_hash"] == first["config_hash"] and second["misses"] == first["misses"]
    table = pd.read_parquet(Path(cfg.results.dir) / "replay.parquet")
    assert table["code_version"].tolist() == ["0.1.0+src.000000000000"]  # one row per config: the newest


def test_source_hash_follows_the_code(tmp_path, monkeypatch):
    """The hash covers every .py file of the code packages, by relative path and content."""
    import freetoken.version as version

    for name in ("freetoken", "sim"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("x = 1\n")
    monkeypatch.setattr(version, "_package_dirs", lambda: {"freetoken": tmp_path / "freetoken",
                                                          "sim": tmp_path / "sim"})

    def fresh():
        version.source_hash.cache_clear()
        return version.source_hash()

    a = fresh()
    (tmp_path / "sim" / "run.py").write_text("y = 2\n")
    b = fresh()
    (tmp_path / "sim" / "run.py").write_text("y = 3\n")
    c = fresh()
    (tmp_path / "sim" / "run.py").write_text("y = 2\n")
    assert len({a, b, c}) == 3 and fresh() == b
    version.source_hash.cache_clear()
