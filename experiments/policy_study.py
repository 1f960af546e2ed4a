"""Placement-policy study: miss rates of every online policy against the Belady bound on every real trace,
never evaluated on the trace its profile or fitted parameters came from.

    python -m experiments.policy_study -m experiment=policy_study [study.doc=docs/policy_study.md]
    python -m experiments.policy_study experiment=policy_study study.case=deepseek-v2-lite study.fraction=0.25

One Hydra run per (case, fraction): its rows go to <results.dir>/policy_study_policies.parquet (one per trace x
policy x residency fraction x decode scenario: experiments/policy_grid.py) and the report <results.dir>/policy_study.md
(experiments/policy_report.py) is rebuilt from every finished run; the tracked docs/policy_study.md only with
study.doc. (The older flags --only / --fractions / --doc still work.)
A case is evaluated on one or more folds (evaluate, profile); its counts are summed over the folds. Per fold,
every policy that reads a profile reads the other fold's (frequency's pins, ktransformers_dynamic's start,
moe_infinity's library), and layer_sweep / lookahead take the decay with the fewest misses on
the profile at the same residency (replayed without a prior) and start from the profile's per-visit rates
as their prior (warm: the highest-rate keys resident, as frequency's pinned set). Misses are demand misses
(offload split: every miss is fetched); `transfers` adds prefetches, and ratio_to_belady = transfers / belady_misses, since Belady bounds the copies
any schedule makes, prefetching or not.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import hydra
import numpy as np

from freetoken.experiments.launchers import launch
from freetoken.experiments.policy_grid import (ACCEPTANCES, BATCHES, BY_LABEL, CARRY, COMBINE, DRAFT_DEPTH, ONLINE,
                                               PROFILED, SCENARIOS, SOLO, check_scenarios, options, params, scenarios)
from freetoken.experiments.policy_hints import HINT_FRACTIONS, hint_rows, replay
from freetoken.experiments.policy_report import COLUMNS, render, write_outputs  # noqa: F401  (the study's names)
from freetoken.experiments.runner import guarded
from freetoken.paths import CONF_DIR
from freetoken.placement.policies.sweep.layer_sweep import visit_rates
from freetoken.trace import RoutingTrace

FRACTIONS = (0.10, 0.25, 0.37, 0.50)
DECAYS = (0.5, 0.8, 0.9, 0.95, 0.99, 0.999)
FIT_REQUESTS = 300  # requests of the profile the decay grid is replayed on (bounds the large traces' cost)


@dataclass(frozen=True, slots=True)
class Fold:
    evaluate: RoutingTrace
    profile: RoutingTrace
    profile_source: str


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    prefill_chunk: int
    real: bool
    folds: Callable[[Path], list[Fold]]  # traces dir -> folds (loads lazily: --only skips the rest)
    card: str | None = None  # model card of the traced model: decode time from the cost model
    hints: bool = False  # also sweep hinted_sweep's hint accuracy and depth


# traces
def _import(root: Path, rel: str) -> RoutingTrace:
    from freetoken.trace.importers import import_trace

    return import_trace(root / rel)


def _requests(trace: RoutingTrace, keep) -> RoutingTrace:
    return trace.select(np.isin(trace.request, list(keep)))


def _request_folds(trace: RoutingTrace, groups: list[list[int]], label: str) -> list[Fold]:
    """Each group evaluated with the other groups as its profile."""
    folds = []
    for i, group in enumerate(groups):
        rest = [r for j, g in enumerate(groups) if j != i for r in g]
        folds.append(Fold(_requests(trace, group), _requests(trace, rest), f"{label} requests {_span(rest)}"))
    return folds


def _span(ids: list[int]) -> str:
    ids = sorted(ids)
    return f"{ids[0]}-{ids[-1]}" if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)) else \
        ",".join(map(str, ids))


def _mixtral(name: str, profile: str) -> Case:
    def folds(root: Path) -> list[Fold]:
        d = "mixtral-8x7b"
        return [Fold(_import(root, f"{d}/{name}.jsonl"), _import(root, f"{d}/{profile}.jsonl"), profile)]
    # token by token: at 2048 a problem is one chunk, 32 calls, and every policy sees only cold misses
    return Case(f"mixtral-8x7b/{name}", 1, True, folds, card="mixtral-8x7b", hints=True)


def _granite(root: Path) -> list[Fold]:
    trace = _import(root, "granite-3.0-1b-a400m/moe_expert_trace.json")
    return _request_folds(trace, [[r] for r in np.unique(trace.request).tolist()], "other prompts:")


def _qwen(root: Path) -> list[Fold]:
    trace = _import(root, "qwen1.5-moe-a2.7b/moe_routes.jsonl")
    return _request_folds(trace, [[r] for r in np.unique(trace.request).tolist()], "other request:")


def _deepseek(root: Path) -> list[Fold]:
    trace = _import(root, "deepseek-v2-lite/deepseek_v2_lite_prefill_top6.npz")
    ids = np.unique(trace.request)
    first, second = ids[: len(ids) // 2], ids[len(ids) // 2:]
    return [Fold(_requests(trace, second), _requests(trace, first), f"first half: prompts {_span(first.tolist())}")]


def _synthetic(root: Path) -> list[Fold]:
    from freetoken.sim.synth import SynthSpec, synthesize

    spec = SynthSpec(num_layers=48, num_experts=128, top_k=8, num_tokens=1024, num_requests=8, seed=0,
                     model="synthetic-48x128-top8")
    trace = synthesize(spec)
    return _request_folds(trace, [[0, 1, 2, 3], [4, 5, 6, 7]], "same generator,")


CASES: dict[str, Case] = {c.name: c for c in (
    _mixtral("gsm8k_2_routing", "humaneval_2_routing"),
    _mixtral("humaneval_1_routing", "gsm8k_2_routing"),
    _mixtral("humaneval_2_routing", "gsm8k_2_routing"),
    _mixtral("routing_raw", "gsm8k_2_routing"),
    Case("granite-3.0-1b-a400m", 2048, True, _granite, hints=True),
    Case("qwen1.5-moe-a2.7b/layer0", 2048, True, _qwen),
    Case("deepseek-v2-lite", 2048, True, _deepseek),
    Case("synthetic/48x128-top8", 2048, False, _synthetic),
)}


# runs
def _misses(trace: RoutingTrace, policy: str, fraction: float, chunk: int, options: dict,
            profile: RoutingTrace | None = None) -> tuple[int, int, int, int]:
    """(capacity, misses, prefetched, accesses)."""
    return replay(trace, policy, fraction, chunk, options, profile)[:4]


def fit_decay(profile: RoutingTrace, fraction: float, chunk: int) -> float:
    """The decay of DECAYS with the fewest layer_sweep misses on (the first FIT_REQUESTS requests of) profile."""
    from freetoken.experiments.traces import first_requests, memo

    sample = memo(profile, ("first_requests", FIT_REQUESTS), lambda: first_requests(profile, FIT_REQUESTS))
    scores = [(_misses(sample, "layer_sweep", fraction, chunk, {"decay": d})[1], i) for i, d in enumerate(DECAYS)]
    return DECAYS[min(scores)[1]]


def run_case(case: Case, root: Path, fractions, policies=ONLINE, advance=lambda n=1: None,
             scenarios=(SOLO,)) -> list[dict]:
    """Rows of every policy label and Belady per (fraction, scenario); a scenario that changes no fold's calls
    (one sequence, no decode tokens) gets no rows. Counts are summed over the folds."""
    if not scenarios or scenarios[0] != SOLO:
        raise ValueError("the scenarios start with the solo one (the others reuse its counts where they change nothing)")
    from freetoken.experiments.traces import memo, stream_of

    folds = memo(case, ("folds", str(root)), lambda: case.folds(root))  # loaded once per process (sweep workers)
    entries = [BY_LABEL[p] for p in policies]
    rows = []
    for f in fractions:
        totals: dict[tuple[str, str], np.ndarray] = {}  # (scenario, label) -> capacity, misses, prefetched, accesses, s
        variant_totals: dict[str, np.ndarray] = {}
        carried: dict[tuple[str, str], np.ndarray] = {}  # (scenario, label) -> the same, with the drafts' carry
        decays, used = [], {SOLO.label}
        for fold in folds:
            decay = fit_decay(fold.profile, f, case.prefill_chunk) if any(e.fitted for e in entries) else None
            decays.append(decay)
            prior = visit_rates(stream_of(fold.profile, case.prefill_chunk), fold.evaluate.num_layers,
                                fold.evaluate.num_experts)
            solo: dict[str, np.ndarray] = {}  # this fold's solo counts: a scenario that changes nothing reuses them
            for sc in scenarios:
                own = sc == SOLO or sc.applies(fold.evaluate)
                if own and sc != SOLO:
                    used.add(sc.label)
                for label, policy, opts in [("belady", "belady", {})] + \
                        [(e.label, e.policy, options(e, decay, prior)) for e in entries]:
                    t = np.asarray(replay(fold.evaluate, policy, f, case.prefill_chunk, opts,
                                          fold.profile if label in PROFILED else None, card=case.card,
                                          scenario=sc.sim_fields()), float) if own else solo[label]
                    if sc == SOLO:
                        solo[label] = t
                    totals[(sc.label, label)] = totals.get((sc.label, label), np.zeros(5)) + t
                for e in [e for e in entries if e.hint] if sc.carries else []:  # + the drafts' carry
                    t = np.asarray(replay(fold.evaluate, e.policy, f, case.prefill_chunk,
                                          {**options(e, decay, prior), "carry": "drafts"}, card=case.card,
                                          scenario=sc.sim_fields()), float) if own else solo[e.label]
                    carried[(sc.label, e.label)] = carried.get((sc.label, e.label), np.zeros(5)) + t
                advance(1 / (len(folds) * len(scenarios)))
            if case.hints and any(np.isclose(f, HINT_FRACTIONS)):
                for label, t in hint_rows(fold.evaluate, f, case.prefill_chunk, decay, prior, case.card):
                    variant_totals[label] = variant_totals.get(label, np.zeros(5)) + t
        tokens = sum(fold.evaluate.num_tokens for fold in folds)
        source = " | ".join(fold.profile_source for fold in folds)
        for sc in scenarios:
            if sc.label not in used:
                continue
            belady = totals[(sc.label, "belady")]
            common = dict(trace=case.name, fraction=f, belady_misses=int(belady[1]), prefill_chunk=case.prefill_chunk,
                          folds=len(folds), real=case.real, belady_ms_per_token=1e3 * belady[4] / tokens,
                          scenario=sc.label)
            named = [(e.label, "main", totals[(sc.label, e.label)], params(e, decays)) for e in entries]
            named += [(e.label, CARRY, carried[(sc.label, e.label)], params(e, decays) + " carry=drafts")
                      for e in entries if (sc.label, e.label) in carried]
            if sc == SOLO:
                named += [("windowed_future" if label.startswith("offline") else "hinted_sweep", label, t,
                           f"decay={'/'.join(map(str, decays))} {label}") for label, t in variant_totals.items()]
            for p, variant, t, par in named + [("belady", "main", belady, "bypass=True")]:
                _, misses, pre, acc = (int(x) for x in t[:4])
                rows.append(dict(common, policy=p, capacity=int(t[0]) // len(folds), misses=misses, accesses=acc,
                                 miss_rate=misses / acc if acc else 0.0, prefetched=pre, transfers=misses + pre,
                                 ratio_to_belady=(misses + pre) / belady[1] if belady[1] else float("nan"),
                                 profile_source=source if p in PROFILED else "", params=par,
                                 ms_per_token=1e3 * t[4] / tokens, variant=variant))
    return rows


# Hydra runs: one (case, fraction) per run, rows in <results.dir>/policy_study_policies, the report beside them
TABLE = "policy_study"
ROWS = "policies"  # the extra table: one row per case x fraction x policy (COLUMNS)
REPORT = "policy_study.md"


@dataclass(frozen=True, slots=True)
class StudySpec:
    """conf/study: which case at which residency; traces: the real traces' directory; doc: a tracked doc to rewrite
    too (None: only the report in the results dir); batches, draft_depth, acceptances, combine: the decode scenarios."""

    case: str
    fraction: float
    traces: str
    doc: str | None = None
    batches: tuple[int, ...] = BATCHES
    draft_depth: int = DRAFT_DEPTH
    acceptances: tuple[float, ...] = ACCEPTANCES
    combine: bool = COMBINE

    def __post_init__(self) -> None:
        if self.case not in CASES:
            raise ValueError(f"study.case: unknown case {self.case}; valid: {', '.join(CASES)}")
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float)) \
                or not 0 < self.fraction <= 1:
            raise ValueError(f"study.fraction must lie in (0, 1], got {self.fraction!r}")
        for name in ("batches", "acceptances"):
            if not isinstance(getattr(self, name), (list, tuple)):
                raise ValueError(f"study.{name}: a list, got {getattr(self, name)!r}")
            object.__setattr__(self, name, tuple(getattr(self, name)))  # Hydra gives lists
        check_scenarios(self.batches, self.draft_depth, self.acceptances, "study.")
        if not isinstance(self.combine, bool):
            raise ValueError(f"study.combine: true or false, got {self.combine!r}")

    def scenarios(self):
        return scenarios(self.batches, self.draft_depth, self.acceptances, self.combine)


def validate(cfg) -> None:
    from freetoken.experiments.runner import build

    if "study" not in cfg:
        raise ValueError("study: missing from the config; run with experiment=policy_study")
    spec = build(cfg, "study")
    if CASES[spec.case].real and not Path(spec.traces).is_dir():
        raise ValueError(f"study.traces: {spec.traces} is not a directory of traces")


def keep_columns(columns: dict) -> dict:
    """Where the traces are and whether a doc is written are not what a run computes."""
    return {k: v for k, v in columns.items() if k not in ("study.traces", "study.doc")}


def compute(cfg):
    from freetoken.experiments.runner import RunOutput, build, show_progress
    from freetoken.progress import progress

    spec = build(cfg, "study")
    with progress(1, f"policy study {spec.case} at {spec.fraction:.0%}", enabled=show_progress(cfg)) as advance:
        rows = run_case(CASES[spec.case], Path(spec.traces), [float(spec.fraction)], ONLINE, advance,
                        spec.scenarios())
    main_rows = [r for r in rows if r["variant"] == "main" and r["scenario"] == SOLO.label]
    best = min((r for r in main_rows if r["policy"] != "belady"), key=lambda r: (r["transfers"], r["policy"]))
    metrics = dict(best_online=best["policy"], best_transfers=best["transfers"], ratio_to_belady=best["ratio_to_belady"],
                   belady_misses=best["belady_misses"], accesses=best["accesses"], miss_rate=best["miss_rate"])
    return RunOutput(metrics, {ROWS: rows})


def run_study(cfg) -> dict:
    """One run (skipped when the same code already ran it), then the report rebuilt from every finished run."""
    from freetoken.experiments.runner import build, run_once

    row = run_once(cfg, TABLE, ("study",), compute, validate, keep_columns)
    doc = build(cfg, "study").doc
    write_report(Path(cfg.results.dir), Path(doc) if doc else None)
    return row


def write_report(results_dir: Path, doc: Path | None = None) -> Path:
    """<results>/policy_study.md (and doc, when asked) from the rows of every finished run, cases in CASES order."""
    import pandas as pd

    from freetoken.io import write_atomic

    path = results_dir / f"{TABLE}_{ROWS}.parquet"
    if not path.is_file():
        raise ValueError(f"{path}: no policy-study rows yet; run python -m experiments.policy_study -m "
                         f"experiment=policy_study")
    frame = pd.read_parquet(path)
    order = {name: i for i, name in enumerate(CASES)}
    frame = frame.assign(_case=frame.trace.map(order)).sort_values(["_case", "fraction"], kind="stable")
    text = render(frame[list(COLUMNS)].reset_index(drop=True)).encode()
    report = results_dir / REPORT
    write_atomic(report, text)
    if doc is not None:
        write_atomic(doc, text)
    return report


LEGACY_FLAGS = ("--traces", "--only", "--fractions", "--out", "--doc", "--render-only")


def main(argv: list[str] | None = None) -> int:
    """The older flags (--only, --fractions, --traces, --doc, --render-only), run through the Hydra config one
    (case, fraction) at a time; --out names the results dir. docs/ is written only with --doc."""
    from freetoken.experiments.compose import compose

    ap = argparse.ArgumentParser(prog="python -m experiments.policy_study", description=__doc__.split("\n")[0])
    ap.add_argument("--traces", type=Path, help="directory of the real traces (default: study.traces)")
    ap.add_argument("--only", nargs="+", metavar="CASE", help=f"cases to run; valid: {', '.join(CASES)}")
    ap.add_argument("--fractions", nargs="+", type=float, default=list(FRACTIONS))
    ap.add_argument("--out", type=Path, help="results dir (default: results.dir)")
    ap.add_argument("--doc", type=Path, help="also rewrite this doc (e.g. docs/policy_study.md)")
    ap.add_argument("--render-only", action="store_true", help="rebuild the report from the results, no replays")
    args = ap.parse_args(argv)
    names = args.only or list(CASES)
    try:
        unknown = [n for n in names if n not in CASES]
        if unknown:
            raise ValueError(f"--only: unknown case {', '.join(unknown)}; valid: {', '.join(CASES)}")
        bad = [f for f in args.fractions if not 0 < f <= 1]
        if bad:
            raise ValueError(f"--fractions: each must lie in (0, 1], got {bad}")
        base = ["experiment=policy_study"] + ([f"results.dir={args.out}"] if args.out else []) + \
            ([f"study.traces={args.traces}"] if args.traces else [])
        if args.render_only:
            cfg = compose(base)
            print(f"wrote {write_report(Path(cfg.results.dir), args.doc)}")
            return 0
        for name in names:
            for f in args.fractions:
                cfg = compose(base + [f"study.case={name}", f"study.fraction={f}"])
                if args.doc:
                    cfg.study.doc = str(args.doc)
                run_study(cfg)
                print(f"done {name} at {f:.0%}", file=sys.stderr)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {Path(cfg.results.dir) / REPORT}" + (f" and {args.doc}" if args.doc else ""))
    return 0


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
@guarded("experiments.policy_study")
def hydra_main(cfg) -> dict:
    return run_study(cfg)


if __name__ == "__main__":
    if any(a.split("=")[0] in LEGACY_FLAGS for a in sys.argv[1:]):
        sys.exit(main())
    launch(hydra_main, "experiments.policy_study")
