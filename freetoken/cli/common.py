"""Small helpers shared by the subcommands.

Building the parser imports nothing heavy (no numpy, numba or torch: `ft --help` is instant); a command imports
what it needs when it runs, and flags whose choices live in a registry take them through LazyChoices.
"""

from __future__ import annotations

import importlib
import json
import sys
from contextlib import contextmanager


class LazyChoices:
    """argparse choices read from `module`.`name` (any iterable of names) the first time they are needed: checking
    a value, or a help page (give the flag a metavar, and %(choices)s in its help to list them)."""

    def __init__(self, module: str, name: str, sort: bool = False):
        self._module, self._name, self._sort = module, name, sort
        self._names: list[str] | None = None

    def _get(self) -> list[str]:
        if self._names is None:
            names = list(getattr(importlib.import_module(self._module), self._name))
            self._names = sorted(names) if self._sort else names
        return self._names

    def __iter__(self):
        return iter(self._get())

    def __contains__(self, value) -> bool:
        return value in self._get()

    def __len__(self) -> int:
        return len(self._get())


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
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)


def add_split_args(p) -> None:
    """The miss-split flags, one definition for `ft sim` and `ft generate` so the two cannot drift."""
    p.add_argument("--split", default="offload", choices=["offload", "hybrid", "cpu"])
    p.add_argument("--rule", default="balanced", choices=["balanced", "paper", "max_fetch"],
                   help="hybrid: how many misses to fetch")
    p.add_argument("--bp", type=float, default=0.0, help="hybrid: pinned PCIe bandwidth, GB/s")
    p.add_argument("--bh", type=float, default=0.0, help="hybrid: host expert-processing bandwidth, GB/s")
    p.add_argument("--max-fetch", type=int, default=0, help="hybrid --rule max_fetch: fetch at most this many")
    p.add_argument("--fetch-order", default="most_tokens", metavar="ORDER",
                   choices=LazyChoices("freetoken.placement.split", "FETCH_ORDERS", sort=True),
                   help="hybrid: which misses are fetched first: %(choices)s")
    p.add_argument("--stream-prefill", action="store_true",
                   help="prefill fetches stream through staging and leave the cache as decode left it")


def split_from_args(args):
    from freetoken.placement import Split

    return Split(args.split, args.rule, args.bp, args.bh, args.max_fetch, args.fetch_order,
                 admit_prefill=not args.stream_prefill)
