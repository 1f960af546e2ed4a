"""Run a recorded trace's requests through the live engine and record what it measured: one row per run.

    python -m experiments.live trace=granite policy=lru cache.fraction=0.25
Needs freetoken.engine; without it the entry point says so and exits (the simulator is experiments.replay).
"""

from __future__ import annotations

import importlib.util

import hydra
from omegaconf import DictConfig

from freetoken.paths import CONF_DIR
from experiments.runner import RunOutput, build, guarded, run_once

TABLE = "live"
GROUPS = ("trace", "policy", "split", "cache", "sim")
NO_ENGINE = ("engine not available: this build has no freetoken.engine, so nothing can run live; "
             "simulate instead with python -m experiments.replay")


def engine_available() -> bool:
    return importlib.util.find_spec("freetoken.engine") is not None


def validate(cfg: DictConfig) -> None:
    if not engine_available():
        raise ValueError(NO_ENGINE)
    for key in GROUPS:
        build(cfg, key)


def compute(cfg: DictConfig) -> RunOutput:
    import freetoken.engine as engine

    run_trace = getattr(engine, "run_trace", None)
    if run_trace is None:
        raise ValueError("engine not available: freetoken.engine has no run_trace(trace, policy, split, capacity) "
                         "to replay a recorded trace live")
    trace_spec, policy, split, cache, sim = (build(cfg, key) for key in GROUPS)
    metrics = run_trace(trace_spec.load(), policy=policy, split=split, cache=cache, sim=sim)
    return RunOutput(dict(metrics))


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
@guarded("experiments.live")
def main(cfg: DictConfig) -> dict:
    return run_once(cfg, TABLE, GROUPS, compute, validate)


if __name__ == "__main__":
    main()
