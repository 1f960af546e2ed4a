"""(b) Predicted decode and prefill tok/s per engine configuration and machine, beside the published figures."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from freetoken.paper_figs.style import new_figure, save, table_ref
from freetoken.paper_figs.table import FigureError, figure_rows, unique_points

NAME = "throughput"
TABLE = "predict"
ENTRY, PRESET = "predict", "throughput"
EXPERIMENTS = ((ENTRY, PRESET),)
COLUMNS = ("model.name", "hardware.name", "engine.name", "predict.workload", "predict.prompt_tokens",
           "predict.decode_tokens", "fits", "decode_tok_s", "prefill_tok_s")
HINT = "python -m experiments.predict -m experiment=throughput"
PUBLISHED = Path(__file__).resolve().parent / "data" / "published_throughput.csv"
MODEL = "qwen3.5-122b-a10b"  # the model of the published table


def published() -> pd.DataFrame:
    return pd.read_csv(PUBLISHED, comment="#").dropna(subset=["conf_engine"])


def draw(results_dir: str | Path, out_dir: str | Path, overrides: dict | None = None) -> list[Path]:
    frame = figure_rows(results_dir, sys.modules[__name__], overrides)
    unique_points(frame, ["hardware.name", "engine.name"], NAME)
    if set(frame["model.name"]) != {MODEL}:
        raise FigureError(f"figure {NAME}: the published figures are for {MODEL}, the rows for "
                          f"{', '.join(sorted(set(frame['model.name'])))}")
    prompt = int(frame["predict.prompt_tokens"].iloc[0])
    pub = published()
    machines = sorted(frame["hardware.name"].unique())
    engines = sorted(frame["engine.name"].unique())
    fig, axes = new_figure(2, 1, width=5.2, height=3.4)
    width = 0.8 / len(engines)
    colors = dict(zip(engines, [f"C{i}" for i in range(len(engines))]))
    labeled: set[str] = set()
    for ax, metric, label in ((axes[0, 0], "decode_tok_s", "decode (tok/s)"),
                              (axes[0, 1], "prefill_tok_s", f"prefill, {prompt}-token prompt (tok/s)")):
        for j, engine in enumerate(engines):
            x = np.arange(len(machines)) + (j - (len(engines) - 1) / 2) * width
            for xi, machine in zip(x, machines):
                row = frame[(frame["hardware.name"] == machine) & (frame["engine.name"] == engine)]
                if row.empty:
                    continue
                if not bool(row["fits"].iloc[0]):
                    ax.text(xi, 0.02, f"{engine}: does not fit", rotation=90, fontsize=5, ha="center",
                            va="bottom", transform=ax.get_xaxis_transform())
                    continue
                ax.bar(xi, row[metric].iloc[0], width, color=colors[engine],
                       label=None if engine in labeled else f"{engine} (predicted)")
                labeled.add(engine)
                ref = pub[(pub["conf_hardware"] == machine) & (pub["conf_engine"] == engine)]
                if not ref.empty:
                    ax.plot(xi, ref[metric].iloc[0], marker="D", color="black", markersize=5, linestyle="",
                            label="published" if metric == "decode_tok_s" else None)
        ax.set_xticks(np.arange(len(machines)), machines, rotation=15, fontsize=7)
        ax.set_xlabel("machine (conf/hardware)")
        ax.set_ylabel(label)
        ax.set_yscale("log" if metric == "prefill_tok_s" else "linear")
        ax.grid(alpha=0.3, axis="y")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    axes[0, 0].legend(seen.values(), seen.keys(), fontsize=6)
    caption = (f"Data: {table_ref(results_dir, TABLE)}, {len(frame)} cost-model predictions of {MODEL} "
               f"(synthetic routing of its shape, {prompt}-token prompt, "
               f"{int(frame['predict.decode_tokens'].iloc[0])} decode tokens; {HINT}); black diamonds: published "
               f"single-stream figures ({PUBLISHED.relative_to(PUBLISHED.parent.parent.parent)}, a public review of "
               f"FreeToken 0.1.2).")
    return save(fig, out_dir, NAME, caption)
