"""One cache config through every entry point: the same inputs give the same slots or the same one-line error from
the engine, the simulator, `ft sim`, `ft generate`, `ft serve`, `ft predict` and the Hydra experiments.

The model is the shipped demo (2 MoE layers x 8 experts = 16 routed experts); the simulator and Hydra replay a
trace the engine recorded on it, so every entry point sizes the same 16 experts. An error is the same sentence in
each entry point's own spelling of the field (`fraction`, `--fraction`, `cache.fraction`).
"""

from __future__ import annotations

import json

import pytest

from freetoken.cli.common import CLI_NAMES
from freetoken.paths import DEMO_MODEL

SKIP = "not this entry point's input"  # serve / predict choose the split themselves and size from memory
NEITHER_CLI = 8  # ft sim / ft generate without a size: their documented default, half of the 16 experts

EXACTLY_ONE = "give exactly one of {fraction} or {capacity}"
ROWS = {  # name: (inputs as config fields, expected slots or error template, per entry point exceptions)
    "fraction 1": ({"fraction": 1.0}, 16, {}),
    "fraction 0.25": ({"fraction": 0.25}, 4, {}),
    "capacity 0": ({"capacity": 0}, 0, {}),
    "fraction 0": ({"fraction": 0.0}, "{fraction} must lie in (0, 1], got 0.0 (no cache at all: {capacity} 0)", {}),
    "fraction above 1": ({"fraction": 1.5}, "{fraction} must lie in (0, 1], got 1.5", {}),
    "capacity above all": ({"capacity": 99},
                           "{capacity} 99 exceeds the model's 16 routed experts (2 MoE layers x 8)", {}),
    "both": ({"capacity": 4, "fraction": 0.5}, EXACTLY_ONE, {}),
    "neither": ({}, EXACTLY_ONE, {"ft sim": NEITHER_CLI, "ft generate": NEITHER_CLI, "ft serve": SKIP,
                                  "ft predict": SKIP}),
    "hybrid without bandwidths": ({"capacity": 4, "mode": "hybrid"},
                                  "{mode} hybrid needs {bp} > 0 and {bh} > 0 (GB/s: the pinned PCIe and host expert "
                                  "lane bandwidths; `ft bench bw` measures both), got {bp} 0.0, {bh} 0.0",
                                  {"ft serve": SKIP, "ft predict": SKIP}),
    "bandwidth with offload": ({"capacity": 4, "bp": 10.0}, "{bp} does nothing for {mode} offload (hybrid only)",
                               {"ft serve": SKIP, "ft predict": SKIP}),
    "max_fetch with balanced": ({"capacity": 4, "mode": "hybrid", "bp": 1.0, "bh": 2.0, "max_fetch": 2},
                                "{max_fetch} does nothing for {rule} balanced (max_fetch only)",
                                {"ft serve": SKIP, "ft predict": SKIP}),
}
SPLIT_FIELDS = ("mode", "bp", "bh", "max_fetch")


def _split(inputs):
    from freetoken.placement import Split

    return Split(inputs.get("mode", "offload"), bp=inputs.get("bp", 0.0), bh=inputs.get("bh", 0.0),
                 max_fetch=inputs.get("max_fetch", 0))


def _size(inputs) -> dict:
    return {"capacity": inputs.get("capacity"), "fraction": inputs.get("fraction")}


def _flags(inputs) -> list[str]:
    flags = []
    for field, flag in (("capacity", "--capacity"), ("fraction", "--fraction"), ("mode", "--split"), ("bp", "--bp"),
                        ("bh", "--bh"), ("max_fetch", "--max-fetch")):
        if field in inputs:
            flags += [flag, str(inputs[field])]
    return flags


def _outcome(fn):
    """Python callers get the error as raised: fields spelled as the config's own (ConfigError's str)."""
    try:
        return fn()
    except ValueError as e:
        return str(e)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """(checkpoint, trace the engine recorded on it)."""
    from freetoken.engine import CacheConfig, Engine, SamplingParams
    from freetoken.models.checkpoint import load_checkpoint
    from freetoken.trace import save

    ckpt = load_checkpoint(DEMO_MODEL)
    engine = Engine(ckpt, CacheConfig(capacity=0), kernels="reference", device="cpu", prefill_chunk=4)
    list(engine.generate([5, 6, 7, 8, 9], SamplingParams(greedy=True), max_tokens=4, stop_token_ids=[]))
    return ckpt, save(engine.trace(), tmp_path_factory.mktemp("demo") / "demo.safetensors")


def _cli(capsys, argv, key="capacity"):
    from freetoken.cli import main

    code = main(argv)
    cap = capsys.readouterr()
    if code:
        lines = cap.err.strip().splitlines()
        assert len(lines) == 1, lines  # one line, never a traceback
        return lines[-1].split(": error: ", 1)[1]
    return json.loads(cap.out)[key]


def run_engine(inputs, demo, capsys, tmp_path, monkeypatch):
    from freetoken.engine import CacheConfig, Engine

    return _outcome(lambda: Engine(demo[0], CacheConfig(split=_split(inputs), **_size(inputs)), kernels="reference",
                                   device="cpu").cache.capacity)


def run_sim(inputs, demo, capsys, tmp_path, monkeypatch):
    from freetoken.trace import load
    from freetoken.sim.run import SimConfig, simulate

    return _outcome(lambda: simulate(load(demo[1]), SimConfig(split=_split(inputs), **_size(inputs))).capacity)


def run_ft_sim(inputs, demo, capsys, tmp_path, monkeypatch):
    return _cli(capsys, ["sim", "--trace", str(demo[1]), "--json", *_flags(inputs)])


def run_ft_generate(inputs, demo, capsys, tmp_path, monkeypatch):
    return _cli(capsys, ["generate", "--token-ids", "5,6,7", "--max-tokens", "1", "--kernels", "reference",
                         "--device", "cpu", "--json", *_flags(inputs)])


def run_ft_serve(inputs, demo, capsys, tmp_path, monkeypatch):
    """`ft serve` end to end up to the point it would serve (that returns at once here): its start-up log says
    the policy slots of the engine's cache."""
    import re

    from freetoken.cli import main
    from freetoken.serve.server import Server

    monkeypatch.setattr(Server, "serve_forever", lambda self: None)
    code = main(["serve", "--device-budget", "1", "--port", "0", *_flags(inputs)])
    err = capsys.readouterr().err
    if code:
        return err.strip().splitlines()[-1].split(": error: ", 1)[1]
    return int(re.search(r"expert cache: .*?, (\d+) slots \+ \d+ staging", err).group(1))


def run_ft_predict(inputs, demo, capsys, tmp_path, monkeypatch):
    return _cli(capsys, ["predict", "--model", str(DEMO_MODEL), "--hardware", "rtx5090-ryzen", "--json",
                         "--prompt-tokens", "4", "--decode-tokens", "2", *_flags(inputs)], "capacity_experts")


def run_hydra(inputs, demo, capsys, tmp_path, monkeypatch):
    """experiments.replay's task on the composed config (what `python -m experiments.replay ...` runs after Hydra
    parsed the overrides): a bad value prints one line and exits 2, a good one writes its row."""
    from freetoken.experiments import replay
    from freetoken.experiments.compose import compose, shrink
    from freetoken.experiments.runner import guarded, run_once

    overrides = ["split=hybrid"] if inputs.get("mode") == "hybrid" else []
    values = {"trace.path": str(demo[1]), "trace.name": "demo", "results.dir": str(tmp_path),
              "results.progress": False, **{f"cache.{k}": v for k, v in _size(inputs).items()},
              **{f"split.{k}": inputs.get(k, 0.0 if k in ("bp", "bh") else 0) for k in SPLIT_FIELDS[1:]}}
    cfg = shrink(compose(overrides), **values)

    task = guarded("experiments.replay")(lambda c: run_once(c, replay.TABLE, replay.GROUPS, replay.compute,
                                                            replay.validate))
    try:
        return task(cfg)["capacity"]
    except SystemExit as e:
        assert e.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1].split(": error: ", 1)[1]
    return line.removeprefix("split: ")  # the group a Split error came from


ENTRY_POINTS = {  # name: (runner, how it spells the fields)
    "engine": (run_engine, {}),
    "sim": (run_sim, {}),
    "ft sim": (run_ft_sim, CLI_NAMES),
    "ft generate": (run_ft_generate, CLI_NAMES),
    "ft serve": (run_ft_serve, CLI_NAMES),
    "ft predict": (run_ft_predict, CLI_NAMES),
    "hydra": (run_hydra, None),  # experiments.specs.HYDRA_NAMES
}


@pytest.mark.parametrize("row", list(ROWS))
def test_one_row_through_every_entry_point(row, demo, capsys, tmp_path, monkeypatch):
    from freetoken.experiments.specs import HYDRA_NAMES

    inputs, expected, exceptions = ROWS[row]
    got, want = {}, {}
    for name, (runner, names) in ENTRY_POINTS.items():
        expect = exceptions.get(name, expected)
        if expect is SKIP:
            continue
        spell = {**{k: k for k in ("fraction", "capacity", "bp", "bh", "mode", "rule", "max_fetch")},
                 **(HYDRA_NAMES if names is None else names)}
        want[name] = expect.format(**spell) if isinstance(expect, str) else expect
        got[name] = runner(inputs, demo, capsys, tmp_path / name.replace(" ", "_"), monkeypatch)
    assert got == want
