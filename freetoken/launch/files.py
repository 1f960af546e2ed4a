"""A planned edit of one config file: shown as a diff, applied with a backup and an atomic replace."""

from __future__ import annotations

import difflib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from freetoken.io import write_atomic


@dataclass(frozen=True, slots=True)
class FileEdit:
    path: Path
    old: str | None  # None: the file does not exist yet
    new: str

    @property
    def changed(self) -> bool:
        return self.old != self.new

    def diff(self) -> str:
        old = [] if self.old is None else self.old.splitlines(keepends=True)
        a = "/dev/null" if self.old is None else f"a/{self.path}"
        lines = difflib.unified_diff(old, self.new.splitlines(keepends=True), a, f"b/{self.path}")
        return "".join(line if line.endswith("\n") else line + "\n" for line in lines)

    def apply(self) -> Path | None:
        """Writes the new text; returns the backup of the old file (None when there was none or nothing changed)."""
        if not self.changed:
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        backup = None
        if self.old is not None:
            backup = self.path.with_name(f"{self.path.name}.{time.strftime('%Y%m%d-%H%M%S')}.bak")
            n = 1
            while backup.exists():
                backup = self.path.with_name(f"{self.path.name}.{time.strftime('%Y%m%d-%H%M%S')}-{n}.bak")
                n += 1
            shutil.copy2(self.path, backup)
        write_atomic(self.path, self.new, new_mode=0o600)  # a new config file may come to hold keys: private
        return backup


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
