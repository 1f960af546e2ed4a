"""Functions only called from compiled code reach LLVM once, inside their entry point (compiled/link_only.py): no
machine code of their own, link-only IR in the disk cache, and the entry decides as the reference does, compiled
cold or linking helpers loaded from a cache another process filled.

Each run is a fresh process with its own cache folder: the toy FIFO policy (tests/toy_policy.py) as two modules, so
the second process compiles toy_b's driver against the engine room's helpers that the first one cached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from freetoken.paths import REPO_ROOT

RUN = """
import gc, json, random, sys
import toy
from numba.core.registry import CPUDispatcher
from freetoken.placement import Split, make_call
from freetoken.placement.compiled.link_only import LINK_ONLY
from freetoken.placement.compiled.policy import CompiledPolicy

rng = random.Random(0)
L, E = 2, 6
calls = [make_call(rng.randrange(L), rng.sample(range(E), rng.randint(1, 4)), rng.choice((0, 1))) for _ in range(300)]
plans = {}
for split in (Split(), Split("cpu"), Split("hybrid", bp=20.0, bh=10.0)):
    compiled, reference = CompiledPolicy(toy.FIFO, 4, L, E), toy.FIFO(4, L, E)
    plans[split.mode] = all(compiled.plan(c, split) == reference.plan(c, split) for c in calls)
libraries = {}  # every compiled function of the placement (and the toy): link-only, and with machine code
for d in gc.get_objects():
    if isinstance(d, CPUDispatcher) and d.py_func.__module__.startswith(("freetoken.placement", "toy")):
        for cres in d.overloads.values():
            lib = cres.library
            libraries[d.py_func.__module__ + "." + d.py_func.__qualname__] = {
                "entry": not d.targetoptions.get("no_cpython_wrapper", False),
                "link_only": getattr(lib, "_ft_link_only", False),
                "machine_code": getattr(lib, "_compiled_object", None) is not None,
                "loaded": sum(d.stats.cache_hits.values()) > 0,
                "kind": lib.serialize_using_object_code()[1]}
print(json.dumps({"plans": plans, "libraries": libraries, "LINK_ONLY": LINK_ONLY}))
"""


def _run(tmp_path: Path, module: str) -> dict:
    env = {**os.environ, "FT_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / module), str(REPO_ROOT)])}
    out = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_helpers_get_no_machine_code_and_the_cache_links_them(tmp_path):
    toy = (REPO_ROOT / "tests" / "toy_policy.py").read_text()
    for name in ("toy_a", "toy_b"):  # (each its own module `toy`: its own driver, the same engine room)
        (tmp_path / name).mkdir()
        (tmp_path / name / "toy.py").write_text(toy.replace('Compiled("fifo"', f'Compiled("{name}"'))
    first, second = _run(tmp_path, "toy_a"), _run(tmp_path, "toy_b")
    for run in (first, second):
        assert run["plans"] == {"offload": True, "cpu": True, "hybrid": True}, run["plans"]
        libs = run["libraries"]
        entries = {n for n, lib in libs.items() if lib["entry"]}
        helpers = set(libs) - entries
        assert any(".replay_calls." in n for n in entries) and {"freetoken.placement.compiled.driver._start",
                                                              "freetoken.placement.compiled.hooks.on_hit",
                                                              "toy.victim"} <= helpers
        assert all(lib["machine_code"] and not lib["link_only"] and lib["kind"] == "object"
                   for n, lib in libs.items() if n in entries)
        assert all(not lib["machine_code"] and lib["link_only"] and lib["kind"] == run["LINK_ONLY"]
                   for n, lib in libs.items() if n in helpers), libs
    # the second process linked the engine room's helpers from the first one's cache (_start's IR holds choose's)
    assert "freetoken.placement.compiled.split.choose" in first["libraries"]
    start = "freetoken.placement.compiled.driver._start"
    assert second["libraries"][start]["loaded"] and not first["libraries"][start]["loaded"]
