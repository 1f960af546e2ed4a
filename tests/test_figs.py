"""paper_figs: every figure drawn from a small results table (real runs), PNG + PDF written, clear refusals."""

from __future__ import annotations

import pandas as pd
import pytest

from freetoken.experiments.compose import compose, shrink
from freetoken.experiments.runner import run_once
from freetoken.paper_figs import NAMES, figure
from freetoken.paper_figs.table import FigureError

PNG, PDF = b"\x89PNG\r\n\x1a\n", b"%PDF-"
SMALL_PREDICT = {"predict.prompt_tokens": 256, "predict.decode_tokens": 8}
SMALL_TURNS = {"predict.turns": 2, "predict.conversations": 1, "predict.prompt_tokens": 64,
               "predict.decode_tokens": 4}
SMALL_LIVE = {"live.requests": 1, "live.prompt_tokens": 8, "live.decode_tokens": 4}
DRAW_OVERRIDES = {"miss_rate": {}, "throughput": SMALL_PREDICT, "hybrid_split": SMALL_PREDICT,
                  "turn_latency": SMALL_TURNS, "sim_vs_live": SMALL_LIVE}


def predict_run(results, preset: str, overrides: list[str], values: dict) -> dict:
    from freetoken.experiments import predict

    cfg = shrink(compose([f"experiment={preset}", *overrides]),
                 **{"results.dir": str(results), "results.progress": False, **values})
    return run_once(cfg, predict.TABLE, predict.groups(cfg), predict.compute, predict.validate,
                    predict.columns_filter)


pytestmark = pytest.mark.slow  # (its fixture runs sweeps to build a results table)


@pytest.fixture(scope="module")
def small_results(tmp_path_factory, tiny_trace_file):
    from freetoken.experiments import replay

    results = tmp_path_factory.mktemp("results")
    for policy in ("lru", "static_layers", "frequency", "belady"):
        for fraction in (0.25, 0.5):
            cfg = shrink(compose(["experiment=miss_rate", f"policy={policy}"]),
                         **{"trace.path": str(tiny_trace_file), "trace.name": "tiny", "cache.fraction": fraction,
                            "results.dir": str(results), "results.progress": False})
            run_once(cfg, replay.TABLE, replay.GROUPS, replay.compute, replay.validate)
    for hw in ("rtx5090-ryzen", "xeon-2xp5000"):
        for engine in ("freetoken-offload", "freetoken-hybrid", "resident"):
            predict_run(results, "throughput", [f"hardware={hw}", f"engine={engine}"], SMALL_PREDICT)
    for hw in ("rtx4060-laptop", "rtx5090-paper"):
        for engine in ("freetoken-offload", "freetoken-hybrid"):
            predict_run(results, "hybrid_split", [f"hardware={hw}", f"engine={engine}"], SMALL_PREDICT)
    from freetoken.experiments import live

    for policy in ("lru", "static_layers"):
        cfg = shrink(compose(["experiment=sim_vs_live", f"policy={policy}"]),
                     **{"results.dir": str(results), "results.progress": False, **SMALL_LIVE})
        run_once(cfg, live.TABLE, live.GROUPS, live.compute, live.validate)
    for anchors in ("true", "false"):
        predict_run(results, "turn_latency", ["engine=freetoken-offload", f"predict.anchors={anchors}"],
                    SMALL_TURNS)
    return results


@pytest.mark.parametrize("name", sorted(DRAW_OVERRIDES))
def test_figure_writes_png_and_pdf(small_results, tmp_path, name):
    paths = figure(name).draw(small_results, tmp_path, DRAW_OVERRIDES[name])
    assert sorted(p.name for p in paths) == [f"{name}.pdf", f"{name}.png"]
    png, pdf = (tmp_path / f"{name}.{ext}" for ext in ("png", "pdf"))
    assert png.read_bytes()[:8] == PNG and png.stat().st_size > 10_000
    assert pdf.read_bytes()[:5] == PDF and pdf.stat().st_size > 5_000


def test_small_table_holds_what_the_figures_read(small_results):
    replay = pd.read_parquet(small_results / "replay.parquet")
    assert len(replay) == 8 and (replay["sim.prefill_chunk"] == 1).all()
    predict = pd.read_parquet(small_results / "predict.parquet")
    resident = predict[predict["engine.name"] == "resident"]
    assert len(resident) == 2 and not resident["fits"].any() and resident["reason"].str.contains("need").all()
    turns = pd.read_parquet(small_results / "predict_turns.parquet")
    assert len(turns) == 4  # 2 runs x 1 conversation x 2 turns
    no_anchor = turns.merge(predict[["config_hash", "predict.anchors"]], on="config_hash")
    second = no_anchor[no_anchor["turn"] == 1].set_index("predict.anchors")
    # without anchors turn 2 re-prefills turn 1 (64 + 4 tokens) before its own 64
    assert second.loc[False, "prefill_tokens"] == 64 + 68 and second.loc[True, "prefill_tokens"] == 64


def test_figure_refuses_a_table_missing_a_column(small_results, tmp_path):
    table = pd.read_parquet(small_results / "replay.parquet").drop(columns=["miss_rate"])
    table.to_parquet(tmp_path / "replay.parquet")
    with pytest.raises(FigureError, match=r"lacks column\(s\) miss_rate"):
        figure("miss_rate").draw(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_figure_refuses_rows_of_another_preset(small_results, tmp_path):
    with pytest.raises(FigureError, match="no rows of its preset"):  # made with 256-token prompts, not 36864
        figure("throughput").draw(small_results, tmp_path)


def test_sim_vs_live_refuses_without_the_engine(small_results, tmp_path, monkeypatch, capsys):
    from freetoken.experiments import live
    from freetoken.paper_figs.__main__ import main

    monkeypatch.setattr(live, "engine_available", lambda: False)
    with pytest.raises(FigureError, match="freetoken.engine is not in this build"):
        figure("sim_vs_live").draw(small_results, tmp_path)
    assert main(["sim_vs_live", "--no-run", "--results", str(small_results), "--out", str(tmp_path)]) == 0
    assert "sim_vs_live   skipped  freetoken.engine is not in this build" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.png"))


def test_cli_names_unknown_figures_and_reports_each(small_results, tmp_path, capsys):
    from freetoken.paper_figs.__main__ import main

    assert main(["nope"]) == 2
    assert "unknown figure 'nope'" in capsys.readouterr().err
    assert main(["miss_rate", "--no-run", "--results", str(small_results), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "miss_rate" in out and "drawn" in out and (tmp_path / "miss_rate.png").is_file()
    assert set(NAMES) == {"miss_rate", "throughput", "hybrid_split", "turn_latency", "sim_vs_live", "policy_study"}


def _captured(monkeypatch, name):
    """Draw a figure keeping its matplotlib figure and caption (the module's save() is swapped for a recorder)."""
    mod = figure(name)
    got = {}

    def keep(fig, out_dir, fig_name, caption):
        got.update(fig=fig, caption=caption)
        return []

    monkeypatch.setattr(mod, "save", keep)
    return mod, got


@pytest.mark.parametrize("name", sorted(DRAW_OVERRIDES))
def test_caption_names_the_table_without_an_absolute_path(small_results, monkeypatch, name):
    import re

    mod, got = _captured(monkeypatch, name)
    mod.draw(small_results, small_results, DRAW_OVERRIDES[name])
    caption = got["caption"]
    assert str(small_results) not in caption and not re.search(r"(^|[\s(])/\w", caption), caption
    assert f"{small_results.name}/{mod.TABLE}" in caption


@pytest.mark.parametrize("name, policies", [("miss_rate", ("lru", "static_layers", "frequency", "belady")),
                                            ("sim_vs_live", ("lru", "static_layers"))])
def test_legends_say_policy_names(small_results, monkeypatch, name, policies):
    mod, got = _captured(monkeypatch, name)
    mod.draw(small_results, small_results, DRAW_OVERRIDES[name])
    legend = {t.get_text() for t in got["fig"].axes[0].get_legend().get_texts()}
    want = {"lru": "LRU", "static_layers": "static layers (llama.cpp)", "frequency": "frequency (KTransformers)",
            "belady": "Belady bound"}
    assert {want[p] for p in policies} <= legend
    assert not any("_" in t for t in legend), legend


def test_hardware_labels_do_not_overlap():
    """Every shipped hardware profile at its BP/BH on the hybrid_split axes, with speed-ups a few percent apart (the
    rtx5090-ryzen and rtxpro6000-ultra7 points sit side by side): no two labels overlap, where the plain offset
    the figure used to take overlaps."""
    import yaml
    from matplotlib.ticker import ScalarFormatter

    from freetoken.paths import CONF_DIR
    from freetoken.paper_figs.style import label_points, new_figure

    hw = sorted((yaml.safe_load(p.read_text()) for p in (CONF_DIR / "hardware").glob("*.yaml")),
                key=lambda h: h["name"])
    xs = [h["pcie_gb_s"] / h["host_gb_s"] for h in hw]
    ys = [1.1 + 0.01 * i for i in range(len(hw))]
    names = [h["name"] for h in hw]

    def boxes(texts):
        renderer = texts[0].figure.canvas.get_renderer()
        return [t.get_window_extent(renderer) for t in texts]

    def overlapping(bs):
        return [(i, j) for i in range(len(bs)) for j in range(i) if bs[i].overlaps(bs[j])]

    fig, axes = new_figure(1, 1, width=4.4, height=3.4)
    ax = axes[0, 0]
    ax.plot(xs, ys, "o")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_ylim(0.9, 4.2)  # the figure's range: the 4060 laptop's prefill speed-up is ~4
    plain = [ax.annotate(n, (x, y), fontsize=5, xytext=(3, 3), textcoords="offset points")
             for x, y, n in zip(xs, ys, names)]
    assert overlapping(boxes(plain))  # the old layout collides on these points
    for t in plain:
        t.remove()
    placed = label_points(ax, xs, ys, names)
    assert sorted(t.get_text() for t in placed) == sorted(names)
    assert not overlapping(boxes(placed))


def test_make_figs_finds_the_checkout_venv_without_activation(tmp_path):
    """`make figs-only` with a bare PATH (no venv active): the Makefile picks <checkout>/.venv/bin/python itself.
    The checkout here is a copy of the Makefile whose .venv/bin/python runs this interpreter."""
    import shutil
    import subprocess
    import sys

    from freetoken.paths import REPO_ROOT

    shutil.copy(REPO_ROOT / "Makefile", tmp_path / "Makefile")
    venv_python = tmp_path / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    venv_python.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "HOME": str(tmp_path)}
    dry = subprocess.run(["make", "-n", "figs"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert dry.stdout.splitlines()[0].startswith(f"{venv_python} -m paper_figs all")
    done = subprocess.run(["make", "figs-only", "RESULTS=res"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    # paper_figs ran (under the venv's interpreter) and reports each figure; with no tables every one fails cleanly
    assert "miss_rate     failed   figure miss_rate: no results table res/replay.parquet" in done.stdout, done.stderr
