"""scripts/precompile.py, which scripts/setup.sh runs after installing without bytecode (uv, or pip's --no-compile):
the modules it imports and the packages it compiles whole get their bytecode written; one that does not import is
reported, and a package to compile whole that is not installed (or whose parent is not) is skipped: neither fails
the set-up."""

from __future__ import annotations

import os
import subprocess
import sys

from freetoken.paths import REPO_ROOT

RUN = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("precompile", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
print(json.dumps(mod.precompile(("imported_one", "not_installed_anywhere"), ("whole_pkg", "absent_pkg", "absent_parent.child"))))
"""


def test_imported_modules_and_whole_packages_get_bytecode(tmp_path):
    (tmp_path / "imported_one.py").write_text("X = 1\n")
    pkg = tmp_path / "whole_pkg"
    (pkg / "deep").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "deep" / "never_imported.py").write_text("Y = 2\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": ""}
    out = subprocess.run([sys.executable, "-c", RUN, str(REPO_ROOT / "scripts" / "precompile.py")], env=env,
                         capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip().splitlines()[-1] == '["not_installed_anywhere"]'
    tag = sys.implementation.cache_tag
    assert (tmp_path / "__pycache__" / f"imported_one.{tag}.pyc").is_file()
    assert (pkg / "deep" / "__pycache__" / f"never_imported.{tag}.pyc").is_file()


def test_says_so_and_succeeds_when_bytecode_writing_is_off():
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "precompile.py")], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0 and "bytecode writing is off" in out.stderr and "Traceback" not in out.stderr
