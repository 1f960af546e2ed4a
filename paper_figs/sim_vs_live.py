"""(e) Simulator vs live engine on recorded traces: the same configs replayed and run live, miss rate and time."""

from __future__ import annotations

import sys
from pathlib import Path

from paper_figs.style import new_figure, save
from paper_figs.table import FigureError, figure_rows, load_table

NAME = "sim_vs_live"
TABLE = "replay"
LIVE_TABLE = "live"
ENTRY, PRESET = "replay", "sim_vs_live"
EXPERIMENTS = (("replay", PRESET), ("live", PRESET))
KEYS = ("trace.name", "policy.name", "split.mode", "cache.fraction", "sim.prefill_chunk")
COLUMNS = KEYS + ("miss_rate",)
HINT = "python -m experiments.replay -m experiment=sim_vs_live; python -m experiments.live -m experiment=sim_vs_live"


def unavailable() -> str | None:
    """Why the figure cannot be drawn in this build (None: it can)."""
    from experiments.live import engine_available

    if not engine_available():
        return "freetoken.engine is not in this build: there are no live runs to compare the simulator with"
    return None


def draw(results_dir: str | Path, out_dir: str | Path, overrides: dict | None = None) -> list[Path]:
    reason = unavailable()
    if reason:
        raise FigureError(f"figure {NAME}: {reason}")
    sim = figure_rows(results_dir, sys.modules[__name__], overrides)
    live = load_table(results_dir, LIVE_TABLE, COLUMNS, NAME, HINT)
    both = sim.merge(live, on=list(KEYS), suffixes=("_sim", "_live"))
    if both.empty:
        raise FigureError(f"figure {NAME}: no config was both replayed and run live in {results_dir}; run {HINT}")
    fig, axes = new_figure(1, 1, width=4.0, height=3.6)
    ax = axes[0, 0]
    for i, (trace, rows) in enumerate(both.groupby("trace.name")):
        ax.plot(rows["miss_rate_sim"], rows["miss_rate_live"], linestyle="", marker="o", color=f"C{i}", label=trace)
    ax.plot([0, 1], [0, 1], color="0.5", linestyle=":", label="agreement")
    ax.set_xlabel("miss rate, simulator (misses / accesses)")
    ax.set_ylabel("miss rate, live engine (misses / accesses)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    caption = (f"Data: {Path(results_dir) / 'replay.parquet'} and {Path(results_dir) / 'live.parquet'}, "
               f"{len(both)} configs run both ways ({HINT}).")
    return save(fig, out_dir, NAME, caption)
