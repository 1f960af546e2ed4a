"""The policy study's report: the rows' columns and docs/policy_study.md rendered from the results table alone
(the per-trace miss-rate tables, decode times, the signal and goal sections, the hint sweeps), and the argparse
study's CSV + doc outputs."""

from __future__ import annotations

from pathlib import Path

from freetoken.experiments.policy_doc import findings, intro, render_hints, time_table
from freetoken.experiments.policy_grid import HINTED_CONFIDENCE, LOOKAHEAD_ACCURACY, ONLINE, SOLO, scenario_order
from freetoken.experiments.policy_signals import carry_table, goal_check, signal_table

COLUMNS = ("trace", "policy", "fraction", "capacity", "misses", "accesses", "miss_rate", "prefetched", "transfers",
           "belady_misses", "ratio_to_belady", "profile_source", "params", "prefill_chunk", "folds", "real",
           "ms_per_token", "belady_ms_per_token", "variant", "scenario")


def write_outputs(rows: list[dict], out: Path, doc: Path) -> None:
    import io

    import pandas as pd

    from freetoken.io import write_atomic

    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    buf = io.StringIO()
    frame.to_csv(buf, index=False)
    write_atomic(out, buf.getvalue().encode())
    write_atomic(doc, render(frame).encode())


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def render(frame) -> str:
    """docs/policy_study.md from the results table alone."""
    labels = sorted(set(frame.scenario.astype(str)), key=scenario_order) if "scenario" in frame.columns \
        else [SOLO.label]
    lines = intro(LOOKAHEAD_ACCURACY, HINTED_CONFIDENCE, labels)
    everything = frame
    if "scenario" in frame.columns:
        frame = frame[frame.scenario.astype(str) == SOLO.label]
    hints = frame
    if "variant" in frame.columns:
        frame = frame[frame.variant.astype(str) == "main"]
    online = [p for p in ONLINE if p in set(frame.policy)]
    for trace, group in frame.groupby("trace", sort=False):
        g0 = group.iloc[0]
        lines += [f"## {trace}", "", f"prefill chunk {g0.prefill_chunk}, {g0.folds} fold(s), "
                  f"{int(g0.accesses)} accesses per fraction", ""]
        head = ["residency", "slots"] + online + ["belady", "best online", "x Belady"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for f, sub in group.groupby("fraction", sort=True):
            by = {r.policy: r for r in sub.itertuples()}
            cells = [f"{f:.0%}", str(by["belady"].capacity)]
            for p in online:
                r = by[p]
                cells.append(_pct(r.miss_rate) + (f" ({_pct(r.transfers / r.accesses)})" if r.prefetched else ""))
            cells.append(_pct(by["belady"].miss_rate))
            best = min(online, key=lambda p: (by[p].transfers, p))
            cells += [best, f"{by[best].ratio_to_belady:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines += time_table(group, online)
    lines += signal_table(everything) + carry_table(everything) + goal_check(everything)
    lines += findings(hints) + render_hints(hints)
    return "\n".join(lines) + "\n"
