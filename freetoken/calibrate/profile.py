"""The bandwidth profile: what `ft bench bw` measured, one JSON file per (GPU, expert format) in the user cache.

Version 2: each lane holds its readings, their median (`gb_s`) and spread, and the threads the host lanes ran on;
a version 1 profile (one reading per lane, which a collapsed reading could fill) is refused: rerun `ft bench bw`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from freetoken.io import write_atomic

PROFILE_VERSION = 2
MODES = ("offload", "hybrid", "cpu")
REQUIRED = {  # field -> type, checked on load
    "version": int, "key": str, "expert_format": str, "geometry": dict, "host": dict, "cpu_lane": dict,
    "recommendation": dict, "threads": int, "repeats": int,
}
LANE_FIELDS = ("gb_s", "median_gb_s", "min_gb_s", "max_gb_s")  # positive numbers in every measured lane


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/freetoken, else ~/.cache/freetoken."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "freetoken"


def profile_key(gpu: str | None, expert_format: str) -> str:
    return f"{gpu or 'cpu'}|{expert_format}"


def profile_path(gpu: str | None, expert_format: str, directory: Path | None = None) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", profile_key(gpu, expert_format)).strip("-").lower()
    return (directory or cache_dir()) / f"bw-{slug}.json"


def save_profile(profile: dict, path: Path) -> Path:
    validate_profile(profile, path)
    write_atomic(path, json.dumps(profile, indent=2) + "\n")
    return path


def load_profile(path: Path) -> dict:
    try:
        profile = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"{path}: cannot read the bandwidth profile ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a JSON text file ({e.reason} at byte {e.start}); rerun `ft bench bw`") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg}, line {e.lineno}); rerun `ft bench bw`") from None
    validate_profile(profile, path)
    return profile


def find_profile(gpu: str | None, expert_format: str, directory: Path | None = None) -> dict | None:
    path = profile_path(gpu, expert_format, directory)
    return load_profile(path) if path.exists() else None


def validate_profile(profile, where) -> None:
    if not isinstance(profile, dict):
        raise ValueError(f"{where}: a profile is a JSON object")
    for name, kind in REQUIRED.items():
        if not isinstance(profile.get(name), kind):
            raise ValueError(f"{where}: field {name!r} missing or not a {kind.__name__}; rerun `ft bench bw`")
    if profile["version"] != PROFILE_VERSION:
        raise ValueError(f"{where}: profile version {profile['version']} is not {PROFILE_VERSION}; rerun `ft bench bw`")
    rec = profile["recommendation"]
    if rec.get("mode") not in MODES:
        raise ValueError(f"{where}: recommendation.mode must be one of {', '.join(MODES)}, got {rec.get('mode')!r}")
    if rec["mode"] == "hybrid" and not (_positive(rec.get("bp_gb_s")) and _positive(rec.get("bh_gb_s"))):
        raise ValueError(f"{where}: a hybrid recommendation needs positive bp_gb_s and bh_gb_s")
    for name in ("threads", "repeats"):
        if profile[name] <= 0:
            raise ValueError(f"{where}: {name} must be positive, got {profile[name]}")
    lanes = {"host": profile["host"], "cpu_lane": profile["cpu_lane"]}
    for group in ("pcie", "overlap"):
        lanes.update({f"{group}.{k}": v for k, v in (profile.get(group) or {}).items() if isinstance(v, dict)})
    for lane, r in lanes.items():
        for f in LANE_FIELDS:
            if not _positive(r.get(f)):
                raise ValueError(f"{where}: {lane}.{f} must be a positive number")
        readings = r.get("readings")
        if not isinstance(readings, list) or not readings:
            raise ValueError(f"{where}: {lane}.readings must list the lane's readings; rerun `ft bench bw`")
        if not r["min_gb_s"] <= r["gb_s"] <= r["max_gb_s"]:
            raise ValueError(f"{where}: {lane}.gb_s {r['gb_s']} is not the median of readings in "
                             f"[{r['min_gb_s']}, {r['max_gb_s']}]")


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0
