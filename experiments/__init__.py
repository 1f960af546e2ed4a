"""Hydra entry points: one tidy results row per run (config columns + metrics), keyed by a config hash.

    python -m experiments.replay policy=lru cache.fraction=0.1
    python -m experiments.replay -m policy=lru,frequency cache.fraction=0.05,0.1
    python -m experiments.predict experiment=throughput

Importing the package registers two resolvers: ${data:traces/x.safetensors} is a shipped file (the checkout's, or the
installed package's), ${repo:results} a path under the checkout (an installed wheel: under the current folder).
"""

from __future__ import annotations

from omegaconf import OmegaConf

from freetoken.paths import CONF_DIR, SHIPPED_TRACES, WORK_ROOT

DATA_DIRS = {"conf": CONF_DIR, "traces": SHIPPED_TRACES}


def _repo_path(rel: str = "") -> str:
    return str((WORK_ROOT / rel).resolve()) if rel else str(WORK_ROOT)


def _data_path(rel: str) -> str:
    """conf/... or traces/...: the shipped copy wherever this install keeps it."""
    top, _, rest = rel.partition("/")
    if top not in DATA_DIRS:
        raise ValueError(f"data:{rel}: shipped data lies under {', '.join(DATA_DIRS)}")
    return str(DATA_DIRS[top] / rest)


if not OmegaConf.has_resolver("repo"):
    OmegaConf.register_new_resolver("repo", _repo_path)
if not OmegaConf.has_resolver("data"):
    OmegaConf.register_new_resolver("data", _data_path)
