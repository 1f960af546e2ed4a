"""A result file written atomically survives an interrupted write: KeyboardInterrupt at the flush to disk (the step
between writing the temporary file and the rename) leaves the old file as it was and nothing beside it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def assert_interrupted_write_keeps_old(path: Path, old: str, monkeypatch, write) -> None:
    """path holds old; write() is the write under test. monkeypatch's fsync is undone when the test ends (or by the
    caller's monkeypatch.undo())."""
    path.write_text(old)

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write()
    assert path.read_text() == old and [p.name for p in path.parent.iterdir()] == [path.name]
