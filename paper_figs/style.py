"""Saving figures the same way: PNG + PDF, a caption line under the axes saying what data produced them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from freetoken.io import write_atomic  # noqa: E402

POLICY_STYLE = {  # one look per policy across figures
    "lru": dict(color="tab:blue", marker="o"),
    "static_layers": dict(color="tab:orange", marker="s"),
    "frequency": dict(color="tab:green", marker="^"),
    "s3fifo": dict(color="tab:purple", marker="v"),
    "layer_sweep": dict(color="tab:brown", marker="D"),
    "lookahead": dict(color="tab:pink", marker="P"),
    "hinted_sweep": dict(color="tab:red", marker="X"),
    "lru per_layer": dict(color="tab:cyan", marker="o", linestyle="--"),
    "ktransformers_dynamic": dict(color="tab:olive", marker="^", linestyle="--"),
    "moe_infinity": dict(color="tab:gray", marker="*"),
    "belady": dict(color="black", marker="", linestyle="--"),
}
POLICY_LABEL = {  # what a legend says: the policy as papers name it, not the config key
    "lru": "LRU",
    "static_layers": "static layers (llama.cpp)",
    "frequency": "frequency (KTransformers)",
    "s3fifo": "S3-FIFO",
    "layer_sweep": "layer sweep",
    "lookahead": "lookahead (router prefetch)",
    "hinted_sweep": "hinted sweep",
    "belady": "Belady bound",
}


def policy_label(name: str) -> str:
    return POLICY_LABEL.get(name, name.replace("_", " "))


def table_ref(results_dir: str | Path, table: str) -> str:
    """A results table as a caption names it: <results folder>/<table>.parquet, never an absolute path (a figure
    travels; the folder it was drawn in does not)."""
    return f"{Path(results_dir).resolve().name}/{table}.parquet"


def label_points(ax, xs, ys, names, fontsize: float = 5) -> list:
    """Annotate each point with its name, moving a label up or down in steps of its height until it overlaps no label
    placed before it (points whose BP/BH differ by a few percent sit side by side on a log axis)."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    placed, boxes = [], []
    step = fontsize * 1.3
    for x, y, name in sorted(zip(xs, ys, names)):
        for k in (0, 1, -1, 2, -2, 3, -3, 4, -4, 5, -5):
            text = ax.annotate(name, (x, y), fontsize=fontsize, xytext=(3, 3 + k * step), textcoords="offset points")
            box = text.get_window_extent(renderer)
            if not any(box.overlaps(b) for b in boxes):
                break
            text.remove()
        placed.append(text)
        boxes.append(box)
    return placed


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 3.6, height: float = 3.0):
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows + 0.6), squeeze=False)
    return fig, axes


def save(fig, out_dir: str | Path, name: str, caption: str) -> list[Path]:
    """Writes <out>/<name>.png and .pdf atomically; the caption is drawn under the plots."""
    import io

    out_dir = Path(out_dir)
    width_in = fig.get_size_inches()[0]
    wrapped = textwrap.fill(caption, width=int(width_in * 16))
    lines = wrapped.count("\n") + 1
    fig.tight_layout(rect=(0, 0.035 * lines + 0.02, 1, 1))
    fig.text(0.01, 0.01, wrapped, fontsize=7, ha="left", va="bottom", color="0.25")
    paths = []
    for ext in ("png", "pdf"):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, dpi=150)
        path = out_dir / f"{name}.{ext}"
        write_atomic(path, buf.getvalue())
        paths.append(path)
    plt.close(fig)
    return paths
