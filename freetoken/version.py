"""The code version a result was computed by: package version + a hash of the source files (+ the git commit when
run from a checkout). Results resume only under the same code version, so a fix reruns what it may change."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import subprocess
from pathlib import Path

from freetoken import __version__

CODE_PACKAGES = ("freetoken", "freetoken.sim", "freetoken.experiments")  # what computes a results row (figures only draw them)


def _package_dirs() -> dict[str, Path]:
    out = {}
    for name in CODE_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            out[name] = Path(next(iter(spec.submodule_search_locations)))
    return out


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """sha256 over the .py files of the code packages (path relative to the package + content), 12 hex digits.
    A package nested in another (a wheel's freetoken/sim) is hashed once, under its own name."""
    dirs = _package_dirs()
    h = hashlib.sha256()
    for name, root in sorted(dirs.items()):
        nested = [d for n, d in dirs.items() if n != name and root in d.parents]
        for file in sorted(root.rglob("*.py")):
            if any(d in file.parents for d in nested) or "__pycache__" in file.parts:
                continue
            h.update(f"{name}/{file.relative_to(root).as_posix()}\0".encode())
            h.update(file.read_bytes())
            h.update(b"\0")
    return h.hexdigest()[:12]


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """'<package version>+src.<source hash>': equal exactly when the code that computes results is."""
    return f"{__version__}+src.{source_hash()}"


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The checkout's HEAD commit ('-dirty' when tracked files changed), or '' outside a git checkout."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return ""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return ""
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
