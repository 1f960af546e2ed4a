"""A built wheel works from any folder: the cards, hardware profiles, conf groups, shipped traces and demo model
are package data; the simulator, experiments and figures live under freetoken.*, so site-packages gets no generic
top-level name. Built and installed here into a temp venv over this interpreter's packages (nothing downloaded);
its `ft sim`, `ft predict` and `ft generate` must print what this checkout prints."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from freetoken.paths import REPO_ROOT

SOURCES = ("pyproject.toml", "README.md", "freetoken", "sim", "experiments", "paper_figs", "conf", "traces")
COMMANDS = {
    "sim": ["sim", "--fraction", "0.25", "--json"],
    "predict": ["predict", "--model", "qwen3-30b-a3b", "--hardware", "rtx5090-ryzen", "--prompt-tokens", "256",
                "--decode-tokens", "8", "--json"],
    "generate": ["generate", "--greedy", "--max-tokens", "4", "--kernels", "reference", "--json"],
}
CLI = "import sys; from freetoken.cli import main; sys.exit(main(sys.argv[1:]))"
VARYING = ("tok_s", "prefill_tok_s", "wall_s", "trace")  # timings, and paths that name the install


def _run(cmd: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (cmd, done.stderr[-2000:])
    return done


def test_every_package_of_the_checkout_is_in_the_wheel_list():
    listed = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO_ROOT).parts) for p in (REPO_ROOT / "freetoken").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)


@pytest.mark.slow
def test_wheel_installs_and_runs_from_any_folder(tmp_path):
    src = tmp_path / "src"  # a clean copy: a stale build/ in the checkout cannot leak into the wheel
    src.mkdir()
    for name in SOURCES:
        path = REPO_ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(path, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
          str(tmp_path / "dist"), str(src)], tmp_path, env)
    wheel = next((tmp_path / "dist").glob("freetoken-*.whl"))
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], tmp_path, env)
    purelib = Path(_run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                                           "['purelib'])"], tmp_path, env).stdout.strip())
    # torch, hydra, ... from this interpreter's environment; the installed wheel comes first on the path
    (purelib / "zz_parent_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps",
          "--no-index", "-q", str(wheel)], tmp_path, env)

    assert sorted(p.name for p in purelib.iterdir() if not p.name.endswith((".pth", ".dist-info"))
                  and p.name != "__pycache__") == ["freetoken"]
    work = tmp_path / "work"  # any folder: not the checkout, not the install
    work.mkdir()
    probe = _run([str(venv / "bin" / "python"), "-c",
                  "import freetoken, importlib.util as u\n"
                  "from freetoken.sim.model_card import load_model_card\n"
                  "from freetoken.paths import CONF_DIR, DEFAULT_TRACE, INSTALLED\n"
                  "print(freetoken.__file__, INSTALLED, CONF_DIR.is_dir(), DEFAULT_TRACE.is_file(),"
                  " load_model_card('qwen3-30b-a3b').name, u.find_spec('sim') is None)"], work, env)
    file, installed, conf, trace, card, no_sim = probe.stdout.split()
    assert file.startswith(str(purelib)) and (installed, conf, trace, card, no_sim) == (
        "True", "True", "True", "qwen3-30b-a3b", "True")
    for name, argv in COMMANDS.items():
        got = json.loads(_run([str(venv / "bin" / "ft"), *argv], work, env).stdout)
        want = json.loads(_run([sys.executable, "-c", CLI, *argv], REPO_ROOT,
                               {**env, "PYTHONPATH": str(REPO_ROOT)}).stdout)
        for key in VARYING:
            got.pop(key, None), want.pop(key, None)
        assert got == want, name
