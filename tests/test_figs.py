"""paper_figs: every figure drawn from a small results table (real runs), PNG + PDF written, clear refusals."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments.compose import compose, shrink
from experiments.runner import run_once
from paper_figs import NAMES, figure
from paper_figs.table import FigureError

PNG, PDF = b"\x89PNG\r\n\x1a\n", b"%PDF-"
SMALL_PREDICT = {"predict.prompt_tokens": 256, "predict.decode_tokens": 8}
SMALL_TURNS = {"predict.turns": 2, "predict.conversations": 1, "predict.prompt_tokens": 64,
               "predict.decode_tokens": 4}
SMALL_LIVE = {"live.requests": 1, "live.prompt_tokens": 8, "live.decode_tokens": 4}
DRAW_OVERRIDES = {"miss_rate": {}, "throughput": SMALL_PREDICT, "hybrid_split": SMALL_PREDICT,
                  "turn_latency": SMALL_TURNS, "sim_vs_live": SMALL_LIVE}


def predict_run(results, preset: str, overrides: list[str], values: dict) -> dict:
    from experiments import predict

    cfg = shrink(compose([f"experiment={preset}", *overrides]),
                 **{"results.dir": str(results), "results.progress": False, **values})
    return run_once(cfg, predict.TABLE, predict.groups(cfg), predict.compute, predict.validate,
                    predict.columns_filter)


@pytest.fixture(scope="module")
def small_results(tmp_path_factory, tiny_trace_file):
    from experiments import replay

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
    from experiments import live

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
    from experiments import live
    from paper_figs.__main__ import main

    monkeypatch.setattr(live, "engine_available", lambda: False)
    with pytest.raises(FigureError, match="freetoken.engine is not in this build"):
        figure("sim_vs_live").draw(small_results, tmp_path)
    assert main(["sim_vs_live", "--no-run", "--results", str(small_results), "--out", str(tmp_path)]) == 0
    assert "sim_vs_live   skipped  freetoken.engine is not in this build" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.png"))


def test_cli_names_unknown_figures_and_reports_each(small_results, tmp_path, capsys):
    from paper_figs.__main__ import main

    assert main(["nope"]) == 2
    assert "unknown figure 'nope'" in capsys.readouterr().err
    assert main(["miss_rate", "--no-run", "--results", str(small_results), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "miss_rate" in out and "drawn" in out and (tmp_path / "miss_rate.png").is_file()
    assert set(NAMES) == {"miss_rate", "throughput", "hybrid_split", "turn_latency", "sim_vs_live"}
