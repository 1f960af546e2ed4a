"""Paper figures from results tables: one module per figure, each with draw(results_dir, out_dir) -> [png, pdf].

    python -m paper_figs all [--out DIR] [--results DIR]   # runs missing sweeps, then draws every figure
    python -m paper_figs miss_rate --no-run                # draws one figure from the tables as they are
"""

from __future__ import annotations

import importlib

NAMES = ("miss_rate", "throughput", "hybrid_split", "turn_latency", "sim_vs_live", "policy_study")


def figure(name: str):
    if name not in NAMES:
        raise ValueError(f"unknown figure {name!r}; valid: {', '.join(NAMES)}, all")
    return importlib.import_module(f"freetoken.paper_figs.{name}")
