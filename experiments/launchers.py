"""Sweep launchers: before Hydra composes, a `hydra/launcher=NAME` whose plugin is not installed is named with the
package to install (Hydra itself only says it "could not load" the plugin's config)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Callable

import yaml

from freetoken.paths import CONF_DIR

# the Hydra plugin config a conf/hydra/launcher file builds on -> (module it needs, pip package)
PLUGINS: dict[str, tuple[tuple[str, str], ...]] = {
    "basic": (),
    "joblib": (("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher"),),
    "ray": (("hydra_plugins.hydra_ray_launcher", "hydra-ray-launcher"), ("ray", "ray[default]")),
    "submitit_slurm": (("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),),
    "submitit_local": (("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),),
}


def plugin_of(name: str, conf_dir: Path = CONF_DIR) -> str:
    """The Hydra plugin config behind conf/hydra/launcher/<name>.yaml (its first defaults entry), or name itself."""
    path = Path(conf_dir) / "hydra" / "launcher" / f"{name}.yaml"
    if not path.is_file():
        return name
    defaults = (yaml.safe_load(path.read_text()) or {}).get("defaults") or []
    first = defaults[0] if defaults else name
    return first if isinstance(first, str) else name


def missing_packages(name: str, conf_dir: Path = CONF_DIR) -> list[str]:
    return [package for module, package in PLUGINS.get(plugin_of(name, conf_dir), ())
            if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None]


def check_launcher(prog: str, argv: list[str], conf_dir: Path = CONF_DIR) -> None:
    """Exit 2 with one line when argv picks a launcher whose packages are absent."""
    for arg in argv:
        key, _, value = arg.partition("=")
        if key.lstrip("+~") != "hydra/launcher" or not value:
            continue
        missing = missing_packages(value, conf_dir)
        if missing:
            print(f"{prog}: error: hydra/launcher={value} needs {' and '.join(missing)}, which is not installed "
                  f"(pip install {' '.join(repr(p) if '[' in p else p for p in missing)})", file=sys.stderr)
            sys.exit(2)


def check_results_dir(prog: str, argv: list[str]) -> None:
    """Exit 2 with one line when results.dir (an override, else $FT_RESULTS_DIR) is a file, lies under one, or
    cannot be made: Hydra makes its log folder there first and would fail with a traceback."""
    import os

    from freetoken.io import folder_problem

    given = [value for key, _, value in (a.partition("=") for a in argv) if key.lstrip("+~") == "results.dir"]
    value = given[-1] if given else os.environ.get("FT_RESULTS_DIR")
    if not value or "${" in value:  # an interpolation: Hydra resolves it
        return
    problem = folder_problem(Path(value))
    if problem is None:
        try:
            Path(value).mkdir(parents=True, exist_ok=True)  # as Hydra is about to; no permission, a read-only disk
        except OSError as e:
            problem = e.strerror or str(e)
    if problem:
        print(f"{prog}: error: results.dir {value}: cannot write ({problem})", file=sys.stderr)
        sys.exit(2)


def launch(main: Callable[[], object], prog: str) -> None:
    """The entry points' `__main__`: check the launcher and the results folder, then hand over to Hydra."""
    check_launcher(prog, sys.argv[1:])
    check_results_dir(prog, sys.argv[1:])
    main()
