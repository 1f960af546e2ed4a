"""The compiled code's disk cache is keyed per policy: editing one policy's file recompiles that policy only, a warm
cache compiles nothing, and a compile is announced before it starts (compiled/cache.py, compiled/notes.py).

Each run is a fresh process with its own cache folder (FT_CACHE_DIR): two copies of the toy policy
(tests/toy_policy.py) as modules of their own, compiled, then run again after one of them is edited."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from freetoken.paths import REPO_ROOT

RUN = """
import json, sys
import toy_a, toy_b
from freetoken.placement.compiled.policy import CompiledPolicy
compiled = {}
for m in (toy_a, toy_b):
    policy = CompiledPolicy(m.FIFO, 3, 2, 4)
    policy.warm()
    compiled[m.__name__] = sum(policy.form.replay.stats.cache_misses.values())
print(json.dumps(compiled))
"""


def _run(tmp_path: Path, cache: Path | None = None) -> tuple[dict, str]:
    """The toy modules in folder tmp_path, compiled or loaded with `cache` (default: tmp_path / cache)."""
    env = {**os.environ, "FT_CACHE_DIR": str(cache or tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)])}
    out = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.mark.slow
def test_editing_one_policy_recompiles_that_one_only(tmp_path):
    toy = (REPO_ROOT / "tests" / "toy_policy.py").read_text()
    for name in ("toy_a", "toy_b"):
        (tmp_path / f"{name}.py").write_text(toy.replace('Compiled("fifo"', f'Compiled("{name}"'))
    compiled, stderr = _run(tmp_path)
    assert compiled == {"toy_a": 1, "toy_b": 1}  # cold: both compile
    assert "compiling toy_a (first use" in stderr and "compiling toy_b (first use" in stderr
    compiled, stderr = _run(tmp_path)
    assert compiled == {"toy_a": 0, "toy_b": 0} and "compiling" not in stderr  # warm: both load
    path = tmp_path / "toy_a.py"
    path.write_text(path.read_text() + "\n# an edit\n")
    compiled, stderr = _run(tmp_path)
    assert compiled == {"toy_a": 1, "toy_b": 0}  # only the edited one compiles again
    assert "compiling toy_a (first use" in stderr and "toy_b" not in stderr


@pytest.mark.slow
def test_the_same_code_in_another_folder_loads_the_first_folders_compile(tmp_path):
    """A cache is keyed by module name and content, not path: a second checkout or a wheel install of the same code
    compiles nothing; an edit there compiles its own version without evicting the first folder's."""
    toy = (REPO_ROOT / "tests" / "toy_policy.py").read_text()
    first, second = tmp_path / "checkout", tmp_path / "elsewhere" / "install"
    for folder in (first, second):
        folder.mkdir(parents=True)
        for name in ("toy_a", "toy_b"):
            (folder / f"{name}.py").write_text(toy.replace('Compiled("fifo"', f'Compiled("{name}"'))
    cache = tmp_path / "cache"
    assert _run(first, cache)[0] == {"toy_a": 1, "toy_b": 1}
    compiled, stderr = _run(second, cache)
    assert compiled == {"toy_a": 0, "toy_b": 0} and "compiling" not in stderr
    (second / "toy_a.py").write_text((second / "toy_a.py").read_text() + "\n# an edit\n")
    assert _run(second, cache)[0] == {"toy_a": 1, "toy_b": 0}
    assert _run(first, cache)[0] == {"toy_a": 0, "toy_b": 0}  # its version is still there


def test_warm_groups_policies_sharing_a_compiled_half():
    from freetoken.placement import BUILTIN
    from freetoken.placement.warmup import _groups

    groups = _groups(BUILTIN)
    assert groups[0] == ["layer_sweep", "lookahead", "hinted_sweep"]  # one half, compiled once, started first
    assert ["static_layers", "frequency"] in groups
    assert sorted(n for g in groups for n in g) == sorted(BUILTIN)


@pytest.mark.slow
def test_warmup_jobs_compiles_each_half_once_in_its_own_worker(tmp_path):
    env = {**os.environ, "FT_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("NUMBA_CACHE_DIR", None)
    cmd = [sys.executable, "-m", "freetoken.cli", "warmup", "--policy", "static_layers", "--policy", "frequency",
           "--policy", "belady", "--jobs", "2"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    assert {line.split()[0] for line in out.stdout.splitlines()} == {"the", "static_layers", "frequency", "belady"}
    assert out.stderr.count("compiling pinned (static_layers, frequency) (first use") == 1
    assert out.stderr.count("compiling belady (first use") == 1
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    assert "compiling" not in again.stderr  # the workers' compiled code is on disk, for any process
    bad = subprocess.run([*cmd[:-1], "0"], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "--jobs: 0" in bad.stderr and "Traceback" not in bad.stderr
