"""Run a figure's sweeps through the experiment entry points; finished configs are skipped by the store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from freetoken.paths import WORK_ROOT


def command(entry: str, preset: str, results_dir: str | Path) -> list[str]:
    return [sys.executable, "-m", f"freetoken.experiments.{entry}", "-m", f"experiment={preset}",
            f"results.dir={Path(results_dir).resolve()}"]


def run_sweep(entry: str, preset: str, results_dir: str | Path, quiet: bool = False) -> None:
    """Raises ValueError naming the sweep when it fails (its own output says why)."""
    cmd = command(entry, preset, results_dir)
    out = subprocess.DEVNULL if quiet else None
    done = subprocess.run(cmd, cwd=WORK_ROOT, stdout=out, stderr=subprocess.PIPE if quiet else None, text=True)
    if done.returncode != 0:
        tail = (done.stderr or "").strip().splitlines()[-1:] if quiet else []
        raise ValueError(f"sweep {' '.join(cmd[2:])} failed (exit {done.returncode})"
                         + (f": {tail[0]}" if tail else ""))
