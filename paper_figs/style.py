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
    "belady": dict(color="black", marker="", linestyle="--"),
}


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
