"""The real config, composed without a command line (Hydra compose API): for notebooks, figures and tests."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

import freetoken.experiments  # noqa: F401  (registers the `repo` resolver)
from freetoken.paths import CONF_DIR


def compose(overrides: list[str] | tuple[str, ...] = (), hydra_config: bool = False) -> DictConfig:
    """conf/config.yaml with command-line style overrides, e.g. ["policy=frequency", "cache.fraction=0.2"]."""
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides), return_hydra_config=hydra_config)


def options(group: str) -> list[str]:
    """The option names of a conf group: the yaml files in conf/<group>/."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def shrink(cfg: DictConfig, **values) -> DictConfig:
    """A copy with dotted keys set, e.g. shrink(cfg, **{"trace.path": p, "results.dir": d})."""
    small = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    for key, value in values.items():
        OmegaConf.update(small, key, value, force_add=True)
    return small
