"""python -m paper_figs {all | NAME ...} [--results DIR] [--out DIR] [--no-run]"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from freetoken.paper_figs import NAMES, figure
from freetoken.paper_figs.sweeps import run_sweep
from freetoken.paper_figs.table import FigureError


def default_results() -> Path:
    from freetoken.paths import WORK_ROOT

    return Path(os.environ.get("FT_RESULTS_DIR", WORK_ROOT / "results"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper_figs", description="draw the paper figures from results tables")
    p.add_argument("figures", nargs="+", metavar="FIGURE", help=f"all, or some of: {', '.join(NAMES)}")
    p.add_argument("--results", type=Path, default=None, help="results dir (default: $FT_RESULTS_DIR or results/)")
    p.add_argument("--out", type=Path, default=None, help="where PNG + PDF go (default: <results>/figures)")
    p.add_argument("--no-run", action="store_true", help="draw from the tables as they are; run no sweep")
    args = p.parse_args(argv)
    names = list(NAMES) if "all" in args.figures else args.figures
    results = args.results or default_results()
    out = args.out or results / "figures"
    try:
        modules = [figure(n) for n in names]
    except ValueError as e:
        print(f"paper_figs: error: {e}", file=sys.stderr)
        return 2
    report: list[tuple[str, str, str]] = []
    for name, mod in zip(names, modules):
        reason = mod.unavailable() if hasattr(mod, "unavailable") else None
        if reason:
            report.append((name, "skipped", reason))
            continue
        try:
            if not args.no_run:
                for entry, preset in mod.EXPERIMENTS:
                    print(f"paper_figs: {name}: sweep experiment={preset} ({entry})", file=sys.stderr)
                    run_sweep(entry, preset, results)
            paths = mod.draw(results, out)
            report.append((name, "drawn", ", ".join(str(p) for p in paths)))
        except (FigureError, ValueError, OSError) as e:
            report.append((name, "failed", str(e)))
    for name, status, detail in report:
        print(f"{name:13s} {status:8s} {detail}")
    return 0 if all(s != "failed" for _, s, _ in report) else 1


if __name__ == "__main__":
    sys.exit(main())
