"""(d) Per-turn latency and TTFT of multi-turn conversations, with cache anchors (KV kept) and without."""

from __future__ import annotations

import sys
from pathlib import Path

from freetoken.paper_figs.style import new_figure, save, table_ref
from freetoken.paper_figs.table import FigureError, figure_rows, load_table

NAME = "turn_latency"
TABLE = "predict"
ENTRY, PRESET = "predict", "turn_latency"
EXPERIMENTS = ((ENTRY, PRESET),)
COLUMNS = ("config_hash", "model.name", "hardware.name", "engine.name", "predict.anchors", "predict.turns",
           "predict.prompt_tokens", "predict.decode_tokens", "fits")
TURN_COLUMNS = ("config_hash", "conversation", "turn", "ttft_s", "latency_s")
HINT = "python -m experiments.predict -m experiment=turn_latency"


def label(engine: str, anchors: bool) -> str:
    return f"{engine}, {'anchors (KV kept)' if anchors else 'no anchors (history re-prefilled)'}"


def draw(results_dir: str | Path, out_dir: str | Path, overrides: dict | None = None) -> list[Path]:
    runs = figure_rows(results_dir, sys.modules[__name__], overrides)
    runs = runs[runs["fits"].astype(bool)]
    turns = load_table(results_dir, f"{TABLE}_turns", TURN_COLUMNS, NAME, HINT)
    turns = turns.merge(runs[["config_hash", "engine.name", "predict.anchors"]], on="config_hash")
    if turns.empty:
        raise FigureError(f"figure {NAME}: no per-turn rows for the preset's runs in "
                          f"{Path(results_dir) / (TABLE + '_turns.parquet')}; make them with {HINT}")
    configs = sorted({(e, bool(a)) for e, a in zip(turns["engine.name"], turns["predict.anchors"])})
    fig, axes = new_figure(2, 1, width=4.4, height=3.4)
    ax_lat, ax_ttft = axes[0, 0], axes[0, 1]
    boxes, names = [], []
    for i, (engine, anchors) in enumerate(configs):
        rows = turns[(turns["engine.name"] == engine) & (turns["predict.anchors"] == anchors)]
        style = dict(color=f"C{i}", linestyle="-" if anchors else "--", marker="o" if anchors else "x")
        mean = rows.groupby("turn")["latency_s"].mean()
        ax_lat.plot(mean.index + 1, mean.values, label=label(engine, anchors), markersize=4, **style)
        ax_lat.plot(rows["turn"] + 1, rows["latency_s"], linestyle="", marker=style["marker"], color=style["color"],
                    alpha=0.35, markersize=3)
        boxes.append(rows["ttft_s"].to_numpy())
        names.append(f"{engine}\n{'anchors' if anchors else 'no anchors'}")
    ax_lat.set_xticks(range(1, int(turns["turn"].max()) + 2))
    ax_lat.set_xlabel("turn of the conversation")
    ax_lat.set_ylabel("turn latency: prefill + decode (s)")
    ax_lat.grid(alpha=0.3)
    ax_lat.legend(fontsize=5.5)
    ax_ttft.boxplot(boxes, showfliers=True)
    ax_ttft.set_xticks(range(1, len(names) + 1), names, fontsize=6)
    ax_ttft.set_ylabel("time to first token per turn (s)")
    ax_ttft.set_xlabel("engine, KV reuse across turns")
    ax_ttft.grid(alpha=0.3, axis="y")
    r = runs.iloc[0]
    caption = (f"Data: {table_ref(results_dir, TABLE + '_turns')} ({len(turns)} turns of {len(runs)} "
               f"cost-model runs; {HINT}): {r['model.name']} on {r['hardware.name']}, conversations of "
               f"{int(r['predict.turns'])} turns x ({int(r['predict.prompt_tokens'])} new prompt + "
               f"{int(r['predict.decode_tokens'])} reply tokens), synthetic routing of the model's shape; a turn's "
               f"time is the difference of predictions over growing conversation prefixes.")
    return save(fig, out_dir, NAME, caption)
