"""Small helpers shared by the subcommands."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=None, default=_default)
    sys.stdout.write("\n")


def _default(o):
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


@contextmanager
def progress(total: int, description: str, enabled: bool = True):
    """Yields advance(n=1); draws on stderr only when enabled and stderr is a terminal."""
    if not enabled or not sys.stderr.isatty():
        yield lambda n=1: None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)


def add_split_args(p) -> None:
    """The miss-split flags, one definition for `ft sim` and `ft generate` so the two cannot drift."""
    from freetoken.placement import FETCH_ORDERS

    p.add_argument("--split", default="offload", choices=["offload", "hybrid", "cpu"])
    p.add_argument("--rule", default="balanced", choices=["balanced", "paper", "max_fetch"],
                   help="hybrid: how many misses to fetch")
    p.add_argument("--bp", type=float, default=0.0, help="hybrid: pinned PCIe bandwidth, GB/s")
    p.add_argument("--bh", type=float, default=0.0, help="hybrid: host expert-processing bandwidth, GB/s")
    p.add_argument("--max-fetch", type=int, default=0, help="hybrid --rule max_fetch: fetch at most this many")
    p.add_argument("--fetch-order", default="most_tokens", choices=sorted(FETCH_ORDERS))
    p.add_argument("--stream-prefill", action="store_true",
                   help="prefill fetches stream through staging and leave the cache as decode left it")


def split_from_args(args):
    from freetoken.placement import Split

    return Split(args.split, args.rule, args.bp, args.bh, args.max_fetch, args.fetch_order,
                 admit_prefill=not args.stream_prefill)
