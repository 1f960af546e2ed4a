"""A progress bar on stderr for long runs (the CLI's replays and imports, the experiments' sweeps)."""

from __future__ import annotations

import sys
from contextlib import contextmanager


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
