"""Sweep launchers: before Hydra composes, a `hydra/launcher=NAME` whose plugin is not installed is named with the
package to install (Hydra itself only says it "could not load" the plugin's config); after it composes, a results.dir
that cannot be written in is one line (ResultsDirCheck), before Hydra makes its log folder there; and a sweep's
placement policies are compiled once, before its jobs start (CompileFirst)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Callable

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

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


def check_results_dir(prog: str, value: str) -> None:
    """Exit 2 with one line when results.dir is a file, lies under one, or cannot be made (no permission, a
    read-only disk): Hydra makes its log folder there first and would fail with a traceback."""
    from freetoken.io import folder_problem

    problem = folder_problem(Path(value))
    if problem is None:
        try:
            Path(value).mkdir(parents=True, exist_ok=True)  # as Hydra is about to
        except OSError as e:
            problem = e.strerror or str(e)
    if problem:
        print(f"{prog}: error: results.dir {value}: cannot write ({problem})", file=sys.stderr)
        sys.exit(2)


class ResultsDirCheck(Callback):
    """conf/hydra/default.yaml's callback: the composed results.dir (the command line's, $FT_RESULTS_DIR, a preset's
    or an interpolation's) checked after Hydra composes and before it makes its log folder under it."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        check_results_dir(f"experiments.{config.hydra.job.name}", config.results.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.on_run_start(config)


class CompileFirst(Callback):
    """conf/hydra/default.yaml's callback: before a multirun's jobs start (parallel workers, which would each compile
    the same placement code), the parent compiles or loads the policies the sweep runs, so every job loads them
    from the disk cache."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from freetoken.placement.warmup import default_jobs, warm

        warm(sweep_policies(config), jobs=default_jobs())


def sweep_policies(config: DictConfig) -> list[str]:
    """The built-in policies a sweep replays: its policy= values, the configured one, or (the policy study, or a
    sweep of values not read here) every built-in."""
    from freetoken.placement import BUILTIN

    if config.get("study") is not None:
        return list(BUILTIN)
    for override in config.hydra.overrides.task:
        key, _, value = override.partition("=")
        if key.lstrip("+~") == "policy":
            names = value.split(",")
            return names if set(names) <= set(BUILTIN) else list(BUILTIN)
    name = config.get("policy", {}).get("name")
    return [name] if name in BUILTIN else []


def launch(main: Callable[[], object], prog: str) -> None:
    """The entry points' `__main__`: check the launcher, then hand over to Hydra (which checks results.dir through
    ResultsDirCheck)."""
    check_launcher(prog, sys.argv[1:])
    main()
