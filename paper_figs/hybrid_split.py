"""(c) The hybrid split against offload across hardware profiles, against BP/BH, with and without DRAM contention."""

from __future__ import annotations

import sys
from pathlib import Path

from matplotlib.ticker import NullFormatter, ScalarFormatter

from freetoken.paper_figs.style import label_points, new_figure, save, table_ref
from freetoken.paper_figs.table import FigureError, figure_rows, unique_points

NAME = "hybrid_split"
TABLE = "predict"
ENTRY, PRESET = "predict", "hybrid_split"
EXPERIMENTS = ((ENTRY, PRESET),)
COLUMNS = ("model.name", "hardware.name", "hardware.pcie_gb_s", "hardware.host_gb_s", "engine.name",
           "predict.workload", "predict.host", "fits", "decode_tok_s", "prefill_tok_s")
HINT = "python -m experiments.predict -m experiment=hybrid_split"
HOST_STYLE = {"shared": dict(marker="o", color="tab:red", label="host DRAM shared by PCIe and CPU lane"),
              "independent": dict(marker="s", color="tab:blue", mfc="none", label="lanes independent")}


def speedups(frame):
    """Per (model, hardware, host): hybrid tok/s over offload tok/s, where both fit."""
    keys = ["model.name", "hardware.name", "predict.host"]
    fit = frame[frame["fits"].astype(bool)]
    off = fit[fit["engine.name"] == "freetoken-offload"].set_index(keys)
    hyb = fit[fit["engine.name"] == "freetoken-hybrid"].set_index(keys)
    both = off.index.intersection(hyb.index)
    out = off.loc[both, ["hardware.pcie_gb_s", "hardware.host_gb_s"]].copy()
    for m in ("prefill_tok_s", "decode_tok_s"):
        out[m] = hyb.loc[both, m] / off.loc[both, m]
    out["bp_over_bh"] = out["hardware.pcie_gb_s"] / out["hardware.host_gb_s"]
    return out.reset_index()


def draw(results_dir: str | Path, out_dir: str | Path, overrides: dict | None = None) -> list[Path]:
    frame = figure_rows(results_dir, sys.modules[__name__], overrides)
    unique_points(frame, ["model.name", "hardware.name", "engine.name", "predict.host"], NAME)
    ratio = speedups(frame)
    if ratio.empty:
        raise FigureError(f"figure {NAME}: no hardware profile where both freetoken-offload and freetoken-hybrid "
                          f"fit in {Path(results_dir) / (TABLE + '.parquet')}; make them with {HINT}")
    models = sorted(ratio["model.name"].unique())
    fig, axes = new_figure(2, 1, width=4.4, height=3.4)
    for ax, metric, label in ((axes[0, 0], "prefill_tok_s", "prefill speed-up, hybrid / offload"),
                              (axes[0, 1], "decode_tok_s", "decode speed-up, hybrid / offload")):
        shared = None
        for host, style in HOST_STYLE.items():
            pts = ratio[ratio["predict.host"] == host].sort_values("bp_over_bh")
            if pts.empty:
                continue
            ax.plot(pts["bp_over_bh"], pts[metric], linestyle="", markersize=6, **style)
            if host == "shared":
                shared = (ax, pts["bp_over_bh"], pts[metric], pts["hardware.name"])
        ax.axhline(1.0, color="0.5", linewidth=0.8, linestyle=":")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks([0.25, 0.5, 1.0, 2.0])
        if shared is not None:  # labels last: their layout needs the final axis limits
            label_points(*shared)
        ax.set_xlabel("BP / BH (pinned PCIe GB/s over host expert GB/s)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=6)
    skipped = sorted(set(frame.loc[~frame["fits"].astype(bool), "hardware.name"]))
    caption = (f"Data: {table_ref(results_dir, TABLE)}, {len(frame)} cost-model predictions of "
               f"{', '.join(models)} (synthetic routing, {int(frame['predict.prompt_tokens'].iloc[0])}-token prompt; "
               f"{HINT}). Hybrid rule q* = m BP/BH." + (f" Does not fit: {', '.join(skipped)}." if skipped else ""))
    return save(fig, out_dir, NAME, caption)
