"""Hydra entry points: one tidy results row per run (config columns + metrics), keyed by a config hash.

    python -m experiments.replay policy=lru cache.fraction=0.1
    python -m experiments.replay -m policy=lru,frequency cache.fraction=0.05,0.1
    python -m experiments.predict experiment=throughput

Importing the package registers the `repo` resolver: ${repo:traces/x.safetensors} is a path inside the checkout.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from freetoken.paths import REPO_ROOT


def _repo_path(rel: str = "") -> str:
    return str((REPO_ROOT / rel).resolve()) if rel else str(REPO_ROOT)


if not OmegaConf.has_resolver("repo"):
    OmegaConf.register_new_resolver("repo", _repo_path)
