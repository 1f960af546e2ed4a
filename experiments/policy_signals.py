"""The policy study's signal sections, from the results table alone: how much of the gap to Belady each signal a
real engine has closes (router hint, batch, drafts), the goal check per scenario, and the goal's status per trace."""

from __future__ import annotations

from freetoken.experiments.policy_grid import (CARRY, HINTED, LOOKAHEAD_ACCURACY, ONLINE, SOLO, drafts_of,
                                               scenario_order)

GOAL_FRACTIONS = (0.25, 0.37, 0.50)
GOAL_RATIO = 1.25
BASELINES = ("lru", "frequency")  # the goal's policy must transfer less than each of these, in the same scenario
UNHINTED = tuple(p for p in ONLINE if p not in HINTED)


def _goal_cells(frame):
    """{(trace, fraction, scenario): {policy: row}} of the real traces at the goal's residencies (main rows)."""
    real = frame[frame.real.astype(bool) & frame.fraction.round(2).isin(GOAL_FRACTIONS)
                 & (frame.variant.astype(str) == "main")]
    return {key: {r.policy: r for r in sub.itertuples()}
            for key, sub in real.groupby(["trace", "fraction", "scenario"], sort=False)}


def _scenarios(cells) -> list[str]:
    """The scenario labels the rows hold, in the grid's order (the study's config chooses them)."""
    return sorted({k[2] for k in cells}, key=scenario_order)


def _best(by: dict, pool) -> tuple[str, float]:
    p = min((p for p in pool if p in by), key=lambda p: (by[p].transfers, p))
    return p, by[p].ratio_to_belady


def signal_table(frame) -> list[str]:
    cells = _goal_cells(frame)
    if not cells:
        return []
    scen = [s for s in _scenarios(cells) if s != SOLO.label]
    hint = f"router hint (assumed a={LOOKAHEAD_ACCURACY})"
    head = ["trace", "residency", "solo, no hint", f"solo + {hint}"] + scen + \
        [f"{s} + {hint}" for s in scen if s.startswith("draft")]
    prose = ["Best online policy's transfers over Belady's on the same calls, at each goal residency of each real "
             "trace:", "no hint (router only, every policy but lookahead / hinted_sweep), the router hint at "
             f"an assumed accuracy {LOOKAHEAD_ACCURACY}",
             "(lookahead, hinted_sweep), then each scenario's best of every policy (batch N: continuous batching of N",
             "sequences; draft d a=x: speculative decoding, each step one verify call of d + 1 tokens). A scenario a",
             "trace cannot show (one sequence, or no decode tokens: prefill-only DeepSeek) is `-`. In brackets: the",
             "same transfers over solo Belady's, the absolute cost (every scenario produces the same decode tokens:",
             "rejected drafts route through the verify call too, so their experts are copies Belady must make as",
             "well, which lowers the ratio to the scenario's own bound without lowering the copies). Per column",
             "below the table: the share of the solo no-hint gap (ratio - 1) it closes, and the change in absolute",
             "transfers against solo no-hint, averaged over the cells that have it."]
    rows, closed, change = [], {}, {}  # closed, change: {column: [per cell]}
    for (trace, f) in dict.fromkeys((k[0], k[1]) for k in cells):
        solo = cells[(trace, f, SOLO.label)]
        base_p, base = _best(solo, UNHINTED)
        solo_belady, base_t = solo["belady"].transfers, solo[base_p].transfers
        row = [trace, f"{f:.0%}", f"{base:.2f} {base_p}"]
        columns = [(f"solo + {hint}", solo, HINTED)] + \
            [(s, cells.get((trace, f, s)), ONLINE) for s in scen] + \
            [(f"{s} + {hint}", cells.get((trace, f, s)), HINTED) for s in scen if s.startswith("draft")]
        for name, by, pool in columns:
            if not by:
                row.append("-")
                continue
            p, r = _best(by, pool)
            row.append(f"{r:.2f} {p} ({by[p].transfers / solo_belady:.2f})")
            change.setdefault(name, []).append(by[p].transfers / base_t - 1)
            if base > 1:
                closed.setdefault(name, []).append((base - r) / (base - 1))
        rows.append(row)
    notes = [f"- {name}: closes {100 * sum(v) / len(v):.0f}% of the gap to its own bound on average ({len(v)} cells, "
             f"{100 * min(v):.0f}% to {100 * max(v):.0f}%); transfers {_signed(change[name])} against solo no hint"
             for name, v in closed.items()]
    return _section("Which signal closes how much of the gap", prose, head, rows, notes)


def carry_table(frame) -> list[str]:
    """The drafts' carry (sim/carry.py): per real trace, goal residency and draft scenario of one sequence, each hinted
    policy's transfers over its scenario's Belady without and with the carry, and the share of that gap it closes."""
    real = frame[frame.real.astype(bool) & frame.fraction.round(2).isin(GOAL_FRACTIONS)]
    carried = real[real.variant.astype(str) == CARRY]
    if carried.empty:
        return []
    main = {(r.trace, round(r.fraction, 2), r.scenario, r.policy): r
            for r in real[real.variant.astype(str) == "main"].itertuples()}
    policies = [p for p in HINTED if p in set(carried.policy)]
    head = ["trace", "residency", "scenario"] + [f"{p}: without / with carry (gap closed)" for p in policies]
    prose = ["Speculative decoding's verify call routes the rejected drafts at every layer; `carry=drafts` tells",
             "lookahead / hinted_sweep their experts as a guess of the next step's, as an engine can: which drafts",
             "were rejected is known only after the last layer, so step s + 1's call of layer l is told step s's",
             "rejected drafts' experts of layers l + 1 .. l + depth (depth 1: the next layer), after the router",
             "hint's keys for the same layers; the last layer is told none. hinted_sweep counts them among its",
             "layer's predictions at the router's accuracy. Transfers over the scenario's own Belady, one sequence",
             "at a time, then the share of the gap (ratio - 1) the carry closes (negative: it widens it)."]
    rows, closed = [], {}  # closed: {policy: [per cell]}
    for (trace, f, sc), sub in carried.groupby(["trace", "fraction", "scenario"], sort=False):
        by = {r.policy: r for r in sub.itertuples()}
        row = [trace, f"{f:.0%}", sc]
        for p in policies:
            base = main.get((trace, round(f, 2), sc, p))
            if p not in by or base is None:
                row.append("")
                continue
            r0, r1 = base.ratio_to_belady, by[p].ratio_to_belady
            share = (r0 - r1) / (r0 - 1) if r0 > 1 else float("nan")
            closed.setdefault(p, []).append(share)
            row.append(f"{r0:.3f} / {r1:.3f} ({100 * share:+.1f}%)")
        rows.append(row)
    notes = [f"- {p}: the carry closes {_signed(v)} of the gap ({len(v)} cells)" for p, v in closed.items()]
    notes.append("")
    if all(abs(sum(v) / len(v)) < 0.05 for v in closed.values()):
        notes.append("The carry closes little or nothing: under 5% of the gap on average for each policy (negative: "
                     "more copies than without it).")
    wider = [p for p, v in closed.items() if sum(v) / len(v) <= -0.05]
    notes += [f"The carry widens the gap on average for {', '.join(wider)}: it adds copies.", ""] if wider else []
    notes += ["In the replay a rejected draft is another token of the same sequence drawn at random "
              "(sim/speculative.py),",
              "so the carry names that sequence's usual experts, a guess about a different token's routing. Told next",
              "to the router hint, inside the sweep, its extra keys are prefetched: lookahead prefetches and protects",
              "every hinted key, so each wrong one adds a copy and holds a slot; hinted_sweep prefetches a key only",
              "when its posterior reaches min_confidence, and the carry's extra names raise its layer's q (lowering",
              "every named key's posterior), which holds back part of the wrong prefetches. A trace of one layer has",
              "no layer inside the sweep to tell, so the carry changes nothing there. A drafter whose rejected tokens",
              "route like the true next token (an MTP head, a near-miss draft) would carry more than this replay can",
              "show; it stays a guess about the next step's tokens, not their routing."]
    return _section("The drafts' carry across the step boundary", prose, head, rows, notes)


def _section(title: str, prose: list[str], head: list[str], rows: list[list[str]], notes: list[str]) -> list[str]:
    """A signal section's lines: its title, the prose saying what the table holds, the table, the notes below."""
    return [f"## {title}", "", *prose, "", *_table(head, rows), "", *notes, ""]


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table: the head, its rule, a line per row."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def _signed(v: list[float]) -> str:
    return f"{100 * sum(v) / len(v):+.0f}% on average ({100 * min(v):+.0f}% to {100 * max(v):+.0f}%)"


def _status(cells, traces, p: str, s: str) -> tuple[list[list[str]], list[str]]:
    """Per trace: its row of ratios for policy p in scenario s (solo where s changes nothing), and the traces met."""
    rows, met_traces = [], []
    for trace in traces:
        row, met_all = [trace], True
        for f in GOAL_FRACTIONS:
            by = cells.get((trace, f, s)) or cells.get((trace, f, drafts_of(s))) or cells.get((trace, f, SOLO.label))
            if not by or p not in by:
                row.append("")
                met_all = False
                continue
            r = by[p]
            below = r.transfers < min(by[b].transfers for b in BASELINES)
            met_all &= below and r.ratio_to_belady <= GOAL_RATIO
            row.append(f"{r.ratio_to_belady:.2f}x" + ("" if below else " (not below lru / frequency)"))
        rows.append(row + ["yes" if met_all else "no"])
        met_traces += [trace] if met_all else []
    return rows, met_traces


def goal_check(frame) -> list[str]:
    """Per (policy, scenario): the goal cells where it transfers less than lru and frequency, and where it is also
    within GOAL_RATIO of Belady; then, for the pair meeting the goal on most traces (then most cells), the status
    per trace."""
    cells = _goal_cells(frame)
    if not cells:
        return []
    traces = list(dict.fromkeys(k[0] for k in cells))
    out = ["## Goal check", "",
           f"Goal: one online policy, using only signals a real engine has, within {GOAL_RATIO}x of Belady's transfers "
           f"on every real trace at {', '.join(f'{f:.0%}' for f in GOAL_FRACTIONS)} residency and below both lru "
           "and fair frequency there (same scenario: batch and drafts are signals a server has when it runs them).",
           ""]
    score = {}
    for sc in _scenarios(cells):
        for p in ONLINE:
            if p in BASELINES:
                continue
            mine = {k: by for k, by in cells.items() if k[2] == sc and p in by}
            ok = {k for k, by in mine.items() if by[p].transfers < min(by[b].transfers for b in BASELINES)}
            met = {k for k in ok if mine[k][p].ratio_to_belady <= GOAL_RATIO}
            if mine:
                score[(p, sc)] = (len(_status(cells, traces, p, sc)[1]), len(met), len(ok), len(mine))
    ranked = sorted(score.items(), key=lambda kv: (-kv[1][0], -kv[1][1], -kv[1][2], kv[0]))
    out += _table(["policy", "scenario", "traces met", "below lru and frequency", "also within the ratio", "cells"],
                  [[p, s, str(n_traces), str(ok), str(met), str(n)] for (p, s), (n_traces, met, ok, n) in ranked[:12]])
    out += ["", "(the 12 pairs meeting the goal on most traces, then in most cells; a trace the scenario cannot show "
            "counts with its drafts alone, else solo)", ""]
    (p, s), _ = ranked[0]
    rows, met_traces = _status(cells, traces, p, s)
    out += [f"Status per trace for {p} ({s}; traces the scenario cannot show: its drafts alone, else solo):", ""]
    out += _table(["trace", *(f"{f:.0%}" for f in GOAL_FRACTIONS), "met"], rows)
    out += ["", f"Met on {len(met_traces)} of {len(traces)} real traces"
            + (f" ({', '.join(met_traces)})" if met_traces else "") + "; the goal (every trace) is "
            + ("met." if len(met_traces) == len(traces) else "not met.")]
    if s != SOLO.label:
        out += [f"The ratios of {s} are to that scenario's own Belady, which routes the rejected drafts too; in copies",
                "the draft scenarios cost more than one token at a time (the signal section's absolute column)."]
    return out + [""]
