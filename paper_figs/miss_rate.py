"""(a) Miss rate vs cache fraction per placement policy, with Belady's offline bound, one panel per trace."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from freetoken.paper_figs.style import POLICY_STYLE, new_figure, policy_label, save, table_ref
from freetoken.paper_figs.table import figure_rows, unique_points

NAME = "miss_rate"
TABLE = "replay"
ENTRY, PRESET = "replay", "miss_rate"
EXPERIMENTS = ((ENTRY, PRESET),)
COLUMNS = ("trace.name", "policy.name", "split.mode", "cache.fraction", "sim.prefill_chunk", "miss_rate",
           "accesses", "num_keys")
HINT = "python -m experiments.replay -m experiment=miss_rate"


def draw(results_dir: str | Path, out_dir: str | Path, overrides: dict | None = None) -> list[Path]:
    frame = figure_rows(results_dir, sys.modules[__name__], overrides)
    unique_points(frame, ["trace.name", "policy.name", "cache.fraction"], NAME)
    traces = sorted(frame["trace.name"].unique())
    ncols = min(3, len(traces))
    fig, axes = new_figure(ncols, math.ceil(len(traces) / ncols))
    for ax, trace in zip(axes.flat, traces):
        rows = frame[frame["trace.name"] == trace]
        for policy in sorted(rows["policy.name"].unique(), key=lambda p: (p == "belady", p)):
            pts = rows[rows["policy.name"] == policy].sort_values("cache.fraction")
            label = policy_label(policy)
            ax.plot(pts["cache.fraction"], pts["miss_rate"], label=label, markersize=4,
                    **POLICY_STYLE.get(policy, {}))
        ax.set_title(f"{trace}\n({int(rows['num_keys'].iloc[0])} experts, {int(rows['accesses'].iloc[0])} accesses)",
                     fontsize=8)
        ax.set_xlabel("GPU cache (fraction of all experts)")
        ax.set_ylabel("miss rate (misses / expert accesses)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(traces):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7)
    chunk = int(frame["sim.prefill_chunk"].iloc[0])
    caption = (f"Data: {table_ref(results_dir, TABLE)}, {len(frame)} replay runs (offload split, "
               f"prefill chunk {chunk} token{'s' if chunk > 1 else ''}), traces {', '.join(traces)}; made by {HINT}. "
               f"Frequency pins the trace's own counts (in-sample); static_layers and frequency start pre-loaded, "
               f"lru and belady cold.")
    return save(fig, out_dir, NAME, caption)
