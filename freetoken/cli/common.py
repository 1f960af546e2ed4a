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
