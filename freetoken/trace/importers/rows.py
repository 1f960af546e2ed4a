"""Reading JSON-lines files row by row, with errors that name the file, the line and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from freetoken.trace.format import TraceError


def read_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line."""
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror})") from None
    with f:
        try:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise TraceError(f"{path}, line {lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
                if not isinstance(row, dict):
                    raise TraceError(f"{path}, line {lineno}: expected a JSON object, got {type(row).__name__}")
                yield lineno, row
        except UnicodeDecodeError as e:
            raise TraceError(f"{path}: not UTF-8 text ({e.reason})") from None


class Row:
    """Typed access to one row's fields; every failure names file, line and field."""

    __slots__ = ("path", "lineno", "row")

    def __init__(self, path: Path, lineno: int, row: dict):
        self.path, self.lineno, self.row = path, lineno, row

    def fail(self, field: str, what: str) -> TraceError:
        return TraceError(f"{self.path}, line {self.lineno}: field '{field}' {what}")

    def get(self, field: str):
        try:
            return self.row[field]
        except KeyError:
            raise self.fail(field, "is missing") from None

    def int(self, field: str) -> int:
        v = self.get(field)
        if type(v) is not int or v < 0:
            raise self.fail(field, f"must be a non-negative integer, got {_short(v)}")
        return v

    def key(self, field: str) -> int | str:
        v = self.get(field)
        if type(v) not in (int, str):
            raise self.fail(field, f"must be an integer or a string, got {_short(v)}")
        return v

    def top_k(self, field: str) -> int:
        """The length of a non-empty list field: fixes K for the rows that follow."""
        v = self.get(field)
        if type(v) is not list or not v:
            raise self.fail(field, f"must be a non-empty list of integers, got {_short(v)}")
        return len(v)

    def ints(self, field: str, k: int) -> list[int]:
        v = self.get(field)
        if type(v) is not list or len(v) != k or not all(type(x) is int for x in v):
            raise self.fail(field, f"must be a list of {k} integers, got {_short(v)}")
        return v

    def floats(self, field: str, k: int) -> list[float]:
        v = self.get(field)
        if type(v) is not list or len(v) != k or not all(type(x) in (float, int) for x in v):
            raise self.fail(field, f"must be a list of {k} numbers, got {_short(v)}")
        return v


def _short(v) -> str:
    s = json.dumps(v) if not isinstance(v, (set, bytes)) else repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def check_picks(path: Path, experts, lines, num_experts: int, field: str) -> None:
    """experts [N, K] ids of N rows read from `lines` [N]: in range and distinct within each row."""
    import numpy as np

    out = np.flatnonzero(((experts < 0) | (experts >= num_experts)).any(axis=1))
    if out.size:
        i = out[0]
        raise TraceError(f"{path}, line {lines[i]}: field '{field}' holds {experts[i].tolist()}; "
                         f"ids must lie in [0, {num_experts})")
    s = np.sort(experts, axis=1)
    dup = np.flatnonzero((s[:, 1:] == s[:, :-1]).any(axis=1))
    if dup.size:
        i = dup[0]
        raise TraceError(f"{path}, line {lines[i]}: field '{field}' repeats an expert: {experts[i].tolist()}")
