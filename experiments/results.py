"""Results on disk: one JSON file per run, consolidated into one tidy table per entry point.

    <dir>/runs/<table>/<config hash>.json   {"row": {...}, "tables": {"turns": [{...}, ...]}}
    <dir>/<table>.parquet, <dir>/<table>.csv                  one row per run
    <dir>/<table>_<extra>.parquet, .csv                       e.g. replay_turns: one row per (run, turn)

Workers never share a file: each run writes its own JSON atomically (temp file + rename), so a killed sweep
leaves only whole runs and re-running skips them. Consolidation rebuilds the tables from runs/ under a lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path

from freetoken.io import write_atomic

HASH_COLUMN = "config_hash"
VERSION_COLUMN = "code_version"  # freetoken.version.code_version() of the code that computed the row


def config_hash(table: str, config: dict) -> str:
    """Stable over key order and machines: the table name plus the config as canonical JSON."""
    blob = json.dumps({"table": table, "config": config}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def read_record(path: Path) -> dict:
    """One run's {"row": {...}, "tables": {...}}; anything else (only possible if a file was edited by hand) is one
    ValueError naming the file."""
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a results record ({e}); delete it to rerun its config") from None
    if not isinstance(record, dict) or not isinstance(record.get("row"), dict) \
            or not isinstance(record.get("tables", {}), dict):
        raise ValueError(f"{path}: not a results record (an object with a 'row' object); delete it to rerun its "
                         f"config")
    return record


class ResultsStore:
    def __init__(self, dir: str | os.PathLike):
        self.dir = Path(dir)

    def run_path(self, table: str, key: str) -> Path:
        return self.dir / "runs" / table / f"{key}.json"

    def has(self, table: str, key: str) -> bool:
        return self.run_path(table, key).is_file()

    def read_run(self, table: str, key: str) -> dict:
        return read_record(self.run_path(table, key))

    def write_run(self, table: str, key: str, row: dict, tables: dict[str, list[dict]] | None = None) -> Path:
        path = self.run_path(table, key)
        record = {"row": row, "tables": tables or {}}
        write_atomic(path, json.dumps(record, default=_jsonable).encode())
        return path

    @contextmanager
    def _lock(self, table: str):
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / f".{table}.lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def consolidate(self, table: str):
        """Rebuild <table>.parquet/.csv (and its extra tables) from every finished run; returns the DataFrame."""
        import pandas as pd  # here, not at import: every sweep worker imports this module

        with self._lock(table):
            rows, extras = [], {}
            for path in sorted((self.dir / "runs" / table).glob("*.json")):
                record = read_record(path)
                rows.append(record["row"])
                key = record["row"][HASH_COLUMN]
                for name, extra_rows in record.get("tables", {}).items():
                    extras.setdefault(name, []).extend({HASH_COLUMN: key, **r} for r in extra_rows)
            frame = pd.DataFrame(rows)
            self._write_table(table, frame)
            for name, extra_rows in extras.items():
                self._write_table(f"{table}_{name}", pd.DataFrame(extra_rows))
            return frame

    def _write_table(self, name: str, frame) -> None:
        import io

        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        write_atomic(self.dir / f"{name}.parquet", buf.getvalue())
        write_atomic(self.dir / f"{name}.csv", frame.to_csv(index=False).encode())

    def table_path(self, name: str) -> Path:
        return self.dir / f"{name}.parquet"


def _jsonable(o):
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
