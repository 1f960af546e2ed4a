"""Package layers without cycles: every import (module level or inside a function) goes to an allowed, lower layer.

    trace <- placement <- engine <- calibrate <- serve <- cli
    quant <- kernels <- host <- engine
                      ^-- sim (beside the engine: neither imports the other)
    engine, sim <- experiments <- paper_figs   (beside the CLI: neither imports the other)
A static AST scan of the source, so a lazy import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from freetoken.paths import REPO_ROOT

SCANNED = ("freetoken", "sim", "experiments", "paper_figs")


def _allowed() -> dict[str, set[str]]:
    deps: dict[str, set[str]] = {}

    def layer(name: str, *below: str) -> None:
        deps[name] = set(below).union(*(deps[b] for b in below))

    layer("freetoken")  # the root modules: __init__ (version), io, paths, kernel_launches, hugepages
    layer("freetoken.quant", "freetoken")
    layer("freetoken.trace", "freetoken")
    layer("freetoken.placement", "freetoken.trace")
    layer("freetoken.kernels", "freetoken.quant")
    layer("freetoken.host", "freetoken.kernels")
    layer("freetoken.models", "freetoken.quant")
    layer("freetoken.engine", "freetoken.placement", "freetoken.host", "freetoken.models")
    layer("sim", "freetoken.placement", "freetoken.models")
    layer("freetoken.calibrate", "freetoken.engine")
    layer("freetoken.serve", "freetoken.calibrate")
    layer("freetoken.launch", "freetoken")
    layer("freetoken.demo", "freetoken.models")
    layer("experiments", "freetoken.engine", "sim")
    layer("paper_figs", "experiments")
    layer("freetoken.cli", "freetoken.serve", "freetoken.launch", "freetoken.demo", "sim")
    return deps


ALLOWED = _allowed()


def package_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "freetoken" and len(parts) > 1 and parts[1] in SCANNED:  # installed names: freetoken.sim -> sim
        parts = parts[1:]
    if parts[0] == "freetoken" and len(parts) > 1 and f"freetoken.{parts[1]}" in ALLOWED:
        return f"freetoken.{parts[1]}"
    return parts[0]


def imports(root: Path = REPO_ROOT) -> list[tuple[str, str, str]]:
    """(importing package, imported package, file:line) for every import between two scanned packages."""
    found = []
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            source = package_of(module)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    if name.split(".")[0] in SCANNED and package_of(name) != source:
                        found.append((source, package_of(name), f"{path.relative_to(root)}:{node.lineno}"))
    return found


def upward(found) -> list[str]:
    return [f"{where}: {src} imports {dst}" for src, dst, where in found if dst not in ALLOWED.get(src, set())]


def test_the_layers_form_no_cycle():
    done: set[str] = set()
    for name, deps in ALLOWED.items():  # each layer declared after everything it may import
        assert deps <= done, (name, deps - done)
        assert name not in deps
        done.add(name)


def test_every_package_is_placed():
    packages = {p.name for p in (REPO_ROOT / "freetoken").iterdir() if (p / "__init__.py").is_file()}
    assert {f"freetoken.{p}" for p in packages} <= set(ALLOWED)


def test_no_upward_import():
    found = imports()
    assert found  # the scan sees the imports it should judge
    assert upward(found) == []


@pytest.mark.parametrize("src, line", [
    ("freetoken/engine/leak.py", "from sim.calls import trace_calls"),  # engine -> sim (its peer)
    ("freetoken/engine/leak.py", "from freetoken.sim.calls import trace_calls"),  # the same, by its installed name
    ("freetoken/serve/leak.py", "import freetoken.experiments.replay"),
    ("freetoken/trace/leak.py", "def f():\n    from freetoken.placement import LRU"),  # lazy, still upward
    ("sim/leak.py", "import freetoken.serve.app"),
    ("freetoken/placement/leak.py", "from freetoken.engine import Engine"),
    ("experiments/leak.py", "from freetoken.cli.common import print_json"),  # experiments sit beside the CLI
    ("freetoken/cli/leak.py", "import freetoken.experiments.replay"),
])
def test_an_upward_import_is_caught(tmp_path, src, line):
    for top in SCANNED:
        (tmp_path / top).mkdir()
    (tmp_path / src).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / src).write_text(line + "\n")
    bad = upward(imports(tmp_path))
    assert len(bad) == 1 and bad[0].startswith(f"{src}:")
