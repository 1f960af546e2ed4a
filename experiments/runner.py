"""The run loop every entry point shares: validate, hash, skip if done, compute, write one row, consolidate."""

from __future__ import annotations

import functools
import logging
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import freetoken
from freetoken.experiments.results import HASH_COLUMN, VERSION_COLUMN, ResultsStore, config_hash
from freetoken.version import code_version, git_commit

log = logging.getLogger("experiments")

# Columns that say where an input lives, not what it is: kept in the row, left out of the hash.
UNHASHED = ("trace.path", "policy.profile.path")


@dataclass(slots=True)
class RunOutput:
    metrics: dict
    tables: dict[str, list[dict]] = field(default_factory=dict)  # extra tidy tables, e.g. one row per turn


def build(cfg: DictConfig, key: str):
    """Instantiate the conf node at `key`; a bad value becomes one ValueError naming the key."""
    node = OmegaConf.select(cfg, key)
    if node is None:
        raise ValueError(f"{key}: missing from the config (choose one with {key}=<option>)")
    try:
        return instantiate(node, _convert_="all")
    except InstantiationException as e:
        from freetoken.placement.config import ConfigError

        cause = e.__cause__
        if isinstance(cause, ConfigError):
            raise cause from None  # its fields worded as config keys where it is reported (guarded)
        if isinstance(cause, ValueError):
            msg = str(cause)
            raise ValueError(msg if msg.startswith(key) or f"{key}." in msg else f"{key}: {msg}") from None
        raise ValueError(f"{key}: {cause if cause is not None else e}") from None


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if k == "_target_":
            continue
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, name + "."))
        elif isinstance(v, (list, tuple)):
            out[name] = ",".join(map(str, v))
        else:
            out[name] = v
    return out


def config_columns(cfg: DictConfig, groups: tuple[str, ...]) -> dict:
    """The resolved config of the groups an entry point reads, flattened to `group.key` columns."""
    resolved = {g: OmegaConf.to_container(cfg[g], resolve=True) for g in groups if g in cfg}
    return flatten(resolved)


def run_once(cfg: DictConfig, table: str, groups: tuple[str, ...], compute: Callable[[DictConfig], RunOutput],
             validate: Callable[[DictConfig], None] | None = None,
             keep: Callable[[dict], dict] | None = None) -> dict:
    """Returns the row (read back when the same config already ran). keep: drops columns that are not config."""
    if validate is not None:
        validate(cfg)  # cheap checks first: a bad config must fail, not be "skipped"
    columns = config_columns(cfg, groups)
    if keep is not None:
        columns = keep(columns)
    key = config_hash(table, {k: v for k, v in columns.items() if k not in UNHASHED})
    store = ResultsStore(cfg.results.dir)
    label = " ".join(f"{k}={columns[k]}" for k in cfg.results.label if columns.get(k) is not None)
    version = code_version()
    if store.has(table, key) and not cfg.results.rerun:
        done = store.read_run(table, key)["row"]
        # the resume key is (config hash, code version): a row computed by other code reruns unless told to reuse
        if done.get(VERSION_COLUMN) == version or cfg.results.reuse_other_code:
            log.info("skip %s (done: %s, code %s)", label, key, done.get(VERSION_COLUMN, "unrecorded"))
            return done
        log.info("rerun %s (done by code %s, this is %s; results.reuse_other_code=true keeps it)", label,
                 done.get(VERSION_COLUMN, "unrecorded"), version)
    start = time.perf_counter()
    out = compute(cfg)
    row = {"table": table, HASH_COLUMN: key, **columns, **out.metrics,
           "wall_s": round(time.perf_counter() - start, 4),
           "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "freetoken_version": freetoken.__version__, VERSION_COLUMN: version, "git_commit": git_commit()}
    store.write_run(table, key, row, out.tables)
    store.consolidate(table)
    shown = " ".join(f"{m}={out.metrics[m]:.4g}" for m in cfg.results.show if m in out.metrics)
    log.info("done %s %s (%.2f s)", label, shown, row["wall_s"])
    return row


def show_progress(cfg: DictConfig) -> bool:
    """A progress bar for a single run only: parallel sweep workers would draw over each other."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not cfg.results.progress:
        return False
    return not HydraConfig.initialized() or HydraConfig.get().mode == RunMode.RUN


def guarded(prog: str) -> Callable:
    """Decorator: user errors print one line naming the bad key and exit with status 2 (no traceback)."""

    def wrap(fn: Callable[[DictConfig], object]) -> Callable[[DictConfig], object]:
        @functools.wraps(fn)
        def task(cfg: DictConfig):
            try:
                return fn(cfg)
            except (ValueError, OSError) as e:
                from freetoken.experiments.specs import HYDRA_NAMES
                from freetoken.placement.config import ConfigError

                message = e.render(HYDRA_NAMES) if isinstance(e, ConfigError) else e  # spelled as its config key
                print(f"{prog}: error: {message}", file=sys.stderr)
                sys.exit(2)

        return task

    return wrap
