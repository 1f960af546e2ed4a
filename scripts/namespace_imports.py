"""Rewrite imports of the checkout's top-level code folders (sim/, experiments/, paper_figs/) to the names they are
installed under, freetoken.sim / freetoken.experiments / freetoken.paper_figs. Idempotent: run it after merging a
branch that still imports `sim...` directly.

    python scripts/namespace_imports.py [ROOT]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PACKAGES = ("sim", "experiments", "paper_figs")
_NAMES = "|".join(PACKAGES)
IMPORT = re.compile(rf"^(\s*)(from|import) ({_NAMES})(?=[\s.]|$)", re.MULTILINE)
# module names inside strings: import_module(f"paper_figs.{name}"), `-m experiments.x`, Hydra _target_ paths
STRINGS = [
    (re.compile(r'import_module\(f"(paper_figs|experiments)\.'), r'import_module(f"freetoken.\1.'),
    (re.compile(r'"-m", f"experiments\.'), r'"-m", f"freetoken.experiments.'),
]
TARGET = re.compile(rf"^(\s*_target_:\s*)({_NAMES})\.", re.MULTILINE)
SKIP = {".git", ".venv", "__pycache__", "build", "dist"}


def rewrite(text: str, yaml: bool) -> str:
    if yaml:
        return TARGET.sub(r"\1freetoken.\2.", text)
    text = IMPORT.sub(r"\1\2 freetoken.\3", text)
    for pattern, repl in STRINGS:
        text = pattern.sub(repl, text)
    return text


def main(root: Path) -> int:
    changed = 0
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".py", ".yaml") or SKIP & set(path.relative_to(root).parts):
            continue
        if path.resolve() == Path(__file__).resolve():
            continue
        text = path.read_text()
        new = rewrite(text, path.suffix == ".yaml")
        if new != text:
            path.write_text(new)
            changed += 1
    print(f"rewrote {changed} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent))
