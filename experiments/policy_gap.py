"""Why no online policy comes within 1.25x of Belady on the Mixtral and Qwen logs: three measurements per
(trace, residency), out of sample as in the study (profiles and fitted decays from the other fold).

1. Published online policies: libCacheSim's ARC, LIRS, Cacheus, LeCaR, 2Q, SLRU, LHD, Sieve, ClockPro,
   Hyperbolic, MQ, LFU and LRU on the same key stream (sequential cache, cold start), each against libCacheSim's own
   Belady on that stream: whether any recency / frequency mix (ARC-, LFU-, learned-weight-like) does better than
   layer_sweep's ratio.
2. Order shuffled: the decode rows of each sequence in a random order (seeded), which keeps every token's routing
   and each layer's marginals and destroys only their order in time. Were the gap a temporal pattern an online
   policy could learn, it would shrink here; if it stays, it is the value of knowing which random draw comes next.
   `static in-sample` pins the top keys of the evaluated trace's own counts (an oracle of the marginals, the best
   fixed set: the optimum online policy when the draws are independent).
3. Per layer: how layer_sweep's excess misses over Belady spread over the layers (the share of the worst layer, and
   how many layers hold half of the excess): a per-layer allocation problem would show as a few layers.
4. The study's best scenario (batch 4 with drafts, best_scenario): layer_sweep against a probe told the current
   step's whole routing, to its own Belady.

    python -m experiments.policy_gap [--cases NAME ...] [--doc docs/policy_gap.md]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np

from freetoken.experiments.policy_grid import Scenario
from freetoken.experiments.policy_hints import replay
from freetoken.experiments.policy_study import CASES, fit_decay
from freetoken.experiments.traces import stream_of
from freetoken.io import write_atomic
from freetoken.paths import WORK_ROOT
from freetoken.placement import DECODE
from freetoken.placement.policies.sweep.layer_sweep import visit_rates
from freetoken.trace import RoutingTrace

FRACTIONS = (0.25, 0.37, 0.50)
LIBCACHESIM = ("LRU", "LFU", "ARC", "LIRS", "Cacheus", "LeCaR", "TwoQ", "SLRU", "LHD", "Sieve", "ClockPro",
               "Hyperbolic", "MQ")  # (LFUDA hangs on these streams in 0.3.5; its S3FIFO and WTinyLFU miss every
# access below ~64 objects, so they are left out rather than reported as 100%)
BEST = Scenario("batch 4 draft 3 a=0.8", "batch + drafts", batch=4, draft_depth=3, acceptance=0.8)
GAP_CASES = ("mixtral-8x7b/gsm8k_2_routing", "mixtral-8x7b/humaneval_1_routing", "mixtral-8x7b/humaneval_2_routing",
             "mixtral-8x7b/routing_raw", "qwen1.5-moe-a2.7b/layer0", "granite-3.0-1b-a400m")


def shuffled(trace: RoutingTrace, seed: int = 0) -> RoutingTrace:
    """Each sequence's decode rows in a random order (prefill rows and sequence order kept)."""
    rng = np.random.default_rng(seed)
    order = np.arange(trace.num_tokens)
    keys = trace.request.astype(np.int64) << 32 | trace.turn.astype(np.int64)
    for k in np.unique(keys):
        rows = np.flatnonzero((keys == k) & (trace.phase == DECODE))
        order[rows] = rng.permutation(rows)
    return trace.select(order)


def _misses(trace, policy, f, chunk, options, profile=None) -> int:
    return replay(trace, policy, f, chunk, options, profile)[1]


def per_layer_excess(trace: RoutingTrace, f: float, chunk: int, options: dict) -> np.ndarray:
    """[L] layer_sweep's misses minus Belady's, per layer."""
    from freetoken.placement import Split
    from freetoken.sim.run import SimConfig, simulate

    out = []
    for policy, opts in (("layer_sweep", options), ("belady", {})):
        config = SimConfig(policy, Split("offload"), fraction=f, prefill_chunk=chunk, options=opts)
        log = simulate(trace, config, stream=stream_of(trace, chunk)).log
        out.append(np.bincount(log.layer, weights=log.fetched + log.cpu, minlength=trace.num_layers))
    return out[0] - out[1]


def libcachesim_ratios(trace: RoutingTrace, f: float, chunk: int) -> tuple[str, float]:
    """(best algorithm, its misses over libCacheSim Belady's) on the trace's key stream."""
    from freetoken.sim.libcachesim import libcachesim_misses

    keys = stream_of(trace, chunk).keys
    cap = int(round(f * trace.num_layers * trace.num_experts))
    belady = libcachesim_misses(keys, cap, "Belady")
    best = min((libcachesim_misses(keys, cap, a), a) for a in LIBCACHESIM)
    return best[1], best[0] / belady


def best_scenario(trace: RoutingTrace, f: float, chunk: int, sweep: dict) -> dict:
    """In the study's best scenario (BEST: batch 4 with drafts of 3 at a = 0.8; drafts alone for one sequence):
    Belady's, layer_sweep's and the step-routing probe's misses. The probe is hinted_sweep told, exactly, every
    later layer's experts of the whole step (all sequences, all drafts; no prefetch): what an online policy could
    know of the current step at best."""
    sc = BEST if BEST.applies(trace) else Scenario("drafts", "drafts", draft_depth=BEST.draft_depth,
                                                   acceptance=BEST.acceptance)
    fields = sc.sim_fields()
    out = {"step belady": replay(trace, "belady", f, chunk, {}, scenario=fields)[1],
           "step layer_sweep": replay(trace, "layer_sweep", f, chunk, sweep, scenario=fields)[1],
           "step probe": None, "step scenario": sc.label}
    if trace.num_layers > 1:
        probe = {**sweep, "accuracy": 1.0, "depth": trace.num_layers - 1, "min_confidence": math.inf}
        out["step probe"] = replay(trace, "hinted_sweep", f, chunk, probe, scenario=fields)[1]
    return out


def case_rows(name: str, root: Path) -> list[dict]:
    case = CASES[name]
    rows = []
    for fold_i, fold in enumerate(case.folds(root)):
        ev, chunk = fold.evaluate, case.prefill_chunk
        mixed = shuffled(ev)
        for f in FRACTIONS:
            decay = fit_decay(fold.profile, f, chunk)
            prior = visit_rates(stream_of(fold.profile, chunk), ev.num_layers, ev.num_experts)
            sweep = {"decay": decay, "prior": prior}
            row = dict(trace=name, fold=fold_i, fraction=f)
            for label, tr in (("", ev), ("shuffled ", mixed)):
                row[label + "belady"] = _misses(tr, "belady", f, chunk, {})
                row[label + "layer_sweep"] = _misses(tr, "layer_sweep", f, chunk, sweep)
                row[label + "static in-sample"] = _misses(tr, "frequency", f, chunk, {}, profile=tr)
            row["frequency"] = _misses(ev, "frequency", f, chunk, {}, profile=fold.profile)
            row["libcachesim"] = libcachesim_ratios(ev, f, chunk)
            row["excess"] = per_layer_excess(ev, f, chunk, sweep) if ev.num_layers > 1 else None
            row.update(best_scenario(ev, f, chunk, sweep))
            rows.append(row)
            print(f"done {name} fold {fold_i} at {f:.0%}", file=sys.stderr, flush=True)
    return rows


def render(rows: list[dict]) -> str:
    """Folds summed per (trace, residency); the libCacheSim ratio and the per-layer spread of the first fold."""
    out = ["# Where the online policies lose against Belady", "",
           "Made by `python -m experiments.policy_gap --doc docs/policy_gap.md` (method: its docstring). Ratios are "
           "misses over Belady's", "on the same calls (solo replay, offload split: every miss is one copy).", "",
           "| trace | residency | layer_sweep | frequency | best of 13 libCacheSim policies | static in-sample | "
           "shuffled: layer_sweep | shuffled: static in-sample | worst layer's share of the excess | "
           "layers holding half of it | best scenario: layer_sweep | + the step's whole routing |",
           "|" + "---|" * 12]
    groups: dict[tuple, list[dict]] = {}
    summary: dict[str, list[tuple]] = {}
    for r in rows:
        groups.setdefault((r["trace"], r["fraction"]), []).append(r)
    for (trace, f), rs in groups.items():
        def ratio(label, prefix=""):
            return sum(r[prefix + label] for r in rs) / sum(r[prefix + "belady"] for r in rs)

        def step(label):
            if any(r[label] is None for r in rs):
                return "-"
            return f"{sum(r[label] for r in rs) / sum(r['step belady'] for r in rs):.2f}"

        alg, lcs = rs[0]["libcachesim"]
        excess = rs[0]["excess"]
        if excess is None or excess.sum() <= 0:
            worst = half = "-"
        else:
            share = np.sort(np.clip(excess, 0, None))[::-1] / np.clip(excess, 0, None).sum()
            worst, half = f"{share[0]:.0%}", str(int(np.searchsorted(np.cumsum(share), 0.5) + 1))
        out.append(f"| {trace} | {f:.0%} | {ratio('layer_sweep'):.2f} | {ratio('frequency'):.2f} | "
                   f"{lcs:.2f} ({alg}) | {ratio('static in-sample'):.2f} | "
                   f"{ratio('layer_sweep', 'shuffled '):.2f} | {ratio('static in-sample', 'shuffled '):.2f} | "
                   f"{worst} | {half} of {len(excess) if excess is not None else 1} | "
                   f"{step('step layer_sweep')} | {step('step probe')} |")
        summary.setdefault(trace.split("/")[0], []).append(
            (ratio("layer_sweep"), lcs, ratio("static in-sample", "shuffled "), step("step layer_sweep"),
             step("step probe")))
    out += ["", f"Best scenario: {BEST.label} where the trace has several sequences, else its drafts alone (one "
            "sequence); its ratios are", "to that scenario's own Belady. `+ the step's whole routing`: hinted_sweep "
            "told exactly every later layer's experts", "of the step (all sequences and drafts), eviction only: the "
            "most an online policy can know of the current step.", "",
            "Per model, the range over its traces and residencies:", ""]
    for model, v in summary.items():
        sweep, lcs, iid = (f"{min(x):.2f}-{max(x):.2f}" for x in list(zip(*v))[:3])
        best = [x for x in (r[3] for r in v) if x != "-"]
        told = [x for x in (r[4] for r in v) if x != "-"]
        tail = f"; in the best scenario layer_sweep {min(best)}-{max(best)}x" + \
            (f", told the step's whole routing {min(told)}-{max(told)}x" if told else "")
        out.append(f"- {model}: layer_sweep {sweep}x; the best published online policy {lcs}x; the best fixed set "
                   f"with the exact marginals on the shuffled routing {iid}x{tail}.")
    out += ["", "Reading: a policy mixing recency and frequency with adaptive weights (ARC, LIRS, Cacheus, LeCaR) does "
            "no better than", "layer_sweep; the excess is spread over the layers rather than held by a few (so an "
            "adaptive per-layer allocation", "has little to move); and when the order of each sequence's tokens is "
            "shuffled, the best fixed set, which is the", "optimum online policy for independent draws (A0 of the "
            "independent reference model), is still that far from", "Belady. What Belady uses is which draw comes "
            "next; no signal of the current token predicts it (the study's", "rest-of-token hint and next-token "
            "transition model change layer_sweep by under 2%); in the best scenario, being told the whole current "
            "step's", "routing (every sequence, every draft) does not bring layer_sweep closer either."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.policy_gap", description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(GAP_CASES), metavar="CASE")
    ap.add_argument("--traces", type=Path, default=Path(os.environ.get("FT_SHARED_TRACES", WORK_ROOT.parent / "shared"
                                                                       / "traces")),
                    help="the real traces (default: $FT_SHARED_TRACES, else ../shared/traces beside the checkout, as "
                         "the study's)")
    ap.add_argument("--doc", type=Path, help="write the table here (default: print it)")
    args = ap.parse_args(argv)
    try:
        unknown = [c for c in args.cases if c not in CASES or not CASES[c].real]
        if unknown:
            raise ValueError(f"--cases: not a real-trace case: {', '.join(unknown)}")
        if not args.traces.is_dir():
            raise ValueError(f"--traces: {args.traces} is not a directory")
        text = render([r for name in args.cases for r in case_rows(name, args.traces)])
        if args.doc:
            write_atomic(args.doc, text)  # a failed write leaves the old doc whole, and names it
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.doc:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
