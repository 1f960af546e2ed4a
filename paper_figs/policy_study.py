"""The policy study (experiments.policy_study): (a) transfers over Belady's against residency per real trace, one
sequence at a time; (b) per real trace and goal residency, the best online policy's ratio under each signal (router
hint, continuous batching, speculative drafts), with the 1.25x goal line."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from freetoken.experiments.policy_grid import CARRY, HINTED
from freetoken.experiments.policy_signals import GOAL_FRACTIONS, GOAL_RATIO
from freetoken.paper_figs.style import POLICY_STYLE, new_figure, policy_label, save, table_ref
from freetoken.paper_figs.table import FigureError, load_table

NAME = "policy_study"
TABLE = "policy_study_policies"
EXPERIMENTS = (("policy_study", "policy_study"),)
COLUMNS = ("trace", "policy", "fraction", "scenario", "variant", "real", "transfers", "ratio_to_belady")
HINT = "python -m experiments.policy_study -m experiment=policy_study"
SHOWN = ("lru", "lru per_layer", "frequency", "ktransformers_dynamic", "moe_infinity", "layer_sweep", "hinted_sweep")


def _rows(results_dir):
    frame = load_table(results_dir, TABLE, COLUMNS, NAME, HINT)
    frame = frame[(frame.variant.astype(str) == "main") & frame.real.astype(bool)]
    if frame.empty:
        raise FigureError(f"figure {NAME}: {TABLE} has no rows of a real trace; run {HINT}")
    return frame


def _panels(n: int):
    ncols = min(4, n)
    fig, axes = new_figure(ncols, math.ceil(n / ncols), width=3.4, height=2.8)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    return fig, axes


def draw_ratios(frame, results_dir, out_dir) -> list[Path]:
    solo = frame[frame.scenario.astype(str) == "solo"]
    traces = sorted(set(solo.trace))
    fig, axes = _panels(len(traces))
    for ax, trace in zip(axes.flat, traces):
        rows = solo[solo.trace == trace]
        for policy in SHOWN:
            pts = rows[rows.policy == policy].sort_values("fraction")
            if len(pts):
                ax.plot(pts.fraction, pts.ratio_to_belady, label=policy_label(policy), markersize=3,
                        **POLICY_STYLE.get(policy, dict(marker=".")))
        ax.axhline(GOAL_RATIO, color="black", linestyle=":", linewidth=0.8)
        ax.set_title(trace, fontsize=8)
        ax.set_xlabel("GPU residency (fraction of experts)")
        ax.set_ylabel("transfers / Belady's")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=6)
    caption = (f"Data: {table_ref(results_dir, TABLE)} (scenario solo, out of sample); dotted: the 1.25x goal. "
               f"Made by {HINT}.")
    return save(fig, out_dir, f"{NAME}_ratios", caption)


def best_by_signal(frame) -> dict:
    """{(trace, fraction): {column: (best ratio to the scenario's Belady, its transfers over solo Belady's)}}: no
    hint / router hint (solo), then every other scenario."""
    out: dict = {}
    solo_belady = {(r.trace, r.fraction): r.transfers for r in frame[(frame.scenario == "solo")
                                                                       & (frame.policy == "belady")].itertuples()}
    for (trace, f, scenario), sub in frame.groupby(["trace", "fraction", "scenario"], sort=False):
        if not any(np.isclose(f, GOAL_FRACTIONS)):
            continue
        cell = out.setdefault((trace, f), {})
        online = sub[(sub.policy != "belady") & (sub.variant.astype(str) != CARRY)]  # the figure: without the carry
        pools = {"solo, no hint": online[~online.policy.isin(HINTED)], "solo + hint": online[online.policy.isin(HINTED)]} \
            if scenario == "solo" else {scenario: online}
        for col, pool in pools.items():
            best = pool.loc[pool.transfers.idxmin()]
            cell[col] = (best.ratio_to_belady, best.transfers / solo_belady[(trace, f)])
    return out


def draw_signals(frame, results_dir, out_dir) -> list[Path]:
    best = best_by_signal(frame)
    traces = sorted({t for t, _ in best})
    columns = list(dict.fromkeys(c for cell in best.values() for c in cell))
    fig, axes = _panels(len(traces))
    width = 0.8 / max(len(columns), 1)
    for ax, trace in zip(axes.flat, traces):
        fracs = sorted(f for t, f in best if t == trace)
        for j, col in enumerate(columns):
            got = [best[(trace, f)].get(col, (np.nan, np.nan)) for f in fracs]
            xs = np.arange(len(fracs)) + j * width
            ax.bar(xs, [g[0] for g in got], width, label=col)
            ax.plot(xs, [g[1] for g in got], "k.", markersize=3, label="over solo Belady" if j == 0 else None)
        ax.axhline(GOAL_RATIO, color="black", linestyle=":", linewidth=0.8)
        ax.axhline(1, color="black", linewidth=0.6)
        ax.set_xticks(np.arange(len(fracs)) + 0.4 - width / 2, [f"{f:.0%}" for f in fracs])
        ax.set_title(trace, fontsize=8)
        ax.set_ylabel("best online / Belady")
        ax.set_ylim(0.9, None)
    axes.flat[0].legend(fontsize=5)
    caption = (f"Data: {table_ref(results_dir, TABLE)}. Bars: the best online policy's transfers over Belady's on the "
               "same calls, per signal; dots: the same transfers over solo Belady's (the absolute cost: rejected "
               "drafts add copies). A missing bar: the trace cannot show that scenario (one sequence, or prefill only). "
               f"Dotted: the 1.25x goal. Made by {HINT}.")
    return save(fig, out_dir, f"{NAME}_signals", caption)


def draw(results_dir: str | Path, out_dir: str | Path, overrides: dict | None = None) -> list[Path]:
    frame = _rows(results_dir)
    return draw_ratios(frame, results_dir, out_dir) + draw_signals(frame, results_dir, out_dir)
