"""(e) Simulator vs live engine: the engine's cache counters against a replay of the routing it recorded."""

from __future__ import annotations

import sys
from pathlib import Path

from freetoken.paper_figs.style import POLICY_STYLE, new_figure, policy_label, save, table_ref
from freetoken.paper_figs.table import FigureError, figure_rows

NAME = "sim_vs_live"
TABLE = "live"
ENTRY, PRESET = "live", "sim_vs_live"
EXPERIMENTS = ((ENTRY, PRESET),)
COUNTS = ("hits", "fetched", "cpu", "evictions")
COLUMNS = ("policy.name", "cache.fraction", "live_miss_rate", "sim_miss_rate", "agree") + tuple(
    f"{side}_{c}" for side in ("live", "sim") for c in COUNTS)
HINT = "python -m experiments.live -m experiment=sim_vs_live"
COUNT_MARKERS = dict(zip(COUNTS, ("o", "s", "^", "x")))


def unavailable() -> str | None:
    """Why the figure cannot be drawn in this build (None: it can)."""
    from freetoken.experiments.live import engine_available

    if not engine_available():
        return "freetoken.engine is not in this build: there are no live runs to compare the simulator with"
    return None


def draw(results_dir: str | Path, out_dir: str | Path, overrides: dict | None = None) -> list[Path]:
    reason = unavailable()
    if reason:
        raise FigureError(f"figure {NAME}: {reason}")
    runs = figure_rows(results_dir, sys.modules[__name__], overrides)
    fig, axes = new_figure(2, 1, width=3.8, height=3.4)
    ax_rate, ax_counts = axes[0, 0], axes[0, 1]
    for policy, rows in runs.groupby("policy.name"):
        style = {k: v for k, v in POLICY_STYLE.get(policy, {}).items() if k != "linestyle"}
        ax_rate.plot(rows["sim_miss_rate"], rows["live_miss_rate"], linestyle="", label=policy_label(policy), **style)
    ax_rate.plot([0, 1], [0, 1], color="0.5", linestyle=":", label="agreement")
    ax_rate.set_xlabel("miss rate, simulator on the recorded trace")
    ax_rate.set_ylabel("miss rate, live engine (misses / accesses)")
    ax_rate.legend(fontsize=6)
    top = 1
    for count, marker in COUNT_MARKERS.items():
        ax_counts.plot(runs[f"sim_{count}"], runs[f"live_{count}"], linestyle="", marker=marker, label=count,
                       alpha=0.8)
        top = max(top, runs[f"sim_{count}"].max(), runs[f"live_{count}"].max())
    ax_counts.plot([0, top], [0, top], color="0.5", linestyle=":")
    ax_counts.set_xlabel("count, simulator (experts per run)")
    ax_counts.set_ylabel("count, live engine (experts per run)")
    ax_counts.legend(fontsize=6)
    for ax in (ax_rate, ax_counts):
        ax.grid(alpha=0.3)
    agree = int(runs["agree"].astype(bool).sum())
    caption = (f"Data: {table_ref(results_dir, TABLE)}, {len(runs)} live runs ({HINT}); each run's "
               f"recorded routing replayed by the simulator with the same policy, split and capacity. "
               f"Every count identical in {agree} of {len(runs)} runs.")
    return save(fig, out_dir, NAME, caption)
