"""Launch configs of the decode kernels as data (tuned_configs.json): kernel -> shape class -> values, per device.

A device missing from the file gets the `default` entry, with one warning per (device, kernel) on CUDA (under the
interpreter there is no device to tune for). benchmarks/tune_kernels.py measures candidates on a GPU and writes its
device's entry; `override` lets it (and tests) force a config without touching the file.
"""

from __future__ import annotations

import json
import warnings
from contextlib import contextmanager
from functools import cache, lru_cache
from pathlib import Path

import torch

CONFIG_FILE = Path(__file__).with_name("tuned_configs.json")
DEFAULT_SMS = 132  # programs to fill when no GPU can be asked (the interpreter): an H100 / H200
_overrides: dict[tuple[str, str], dict] = {}
_warned: set[tuple[str, str]] = set()


def _cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive ints (triton.cdiv without importing Triton)."""
    return -(-a // b)


@lru_cache(maxsize=None)
def load_table(path: Path = CONFIG_FILE) -> dict:
    """The whole file, checked once: every kernel of every device has an `any` or named shape classes of dicts."""
    try:
        table = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read tuned kernel configs ({e})") from e
    if table.get("format_version") != 1 or not isinstance(table.get("default"), dict):
        raise ValueError(f"{path}: format_version must be 1 with a 'default' entry")
    for device, kernels in {"default": table["default"], **table.get("devices", {})}.items():
        for kernel, classes in kernels.items():
            if not isinstance(classes, dict) or not all(isinstance(v, dict) for v in classes.values()):
                raise ValueError(f"{path}: {device}.{kernel} must map shape classes to config objects")
    return table


@cache  # read on every decode launch; a device's name and SM count do not change in a process
def device_name(device: torch.device) -> str:
    """The key a device's configs live under: the CUDA device name; 'interpreter' for CPU tensors."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "interpreter"


@cache
def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_SMS


def _pick(classes: dict, shape_class: str) -> dict | None:
    return classes.get(shape_class, classes.get("any"))


def tuned(kernel: str, shape_class: str, device: torch.device) -> dict:
    """The config of `kernel` for `shape_class` on `device`: an override, else the device's entry, else default."""
    if (kernel, shape_class) in _overrides:
        return _overrides[(kernel, shape_class)]
    table = load_table()
    name = device_name(device)
    found = _pick(table.get("devices", {}).get(name, {}).get(kernel, {}), shape_class)
    if found is not None:
        return found
    if device.type == "cuda" and (name, kernel) not in _warned:
        _warned.add((name, kernel))
        warnings.warn(f"no tuned {kernel} configs for {name} in {CONFIG_FILE.name}: using the defaults "
                      "(run benchmarks/tune_kernels.py on this GPU)", stacklevel=3)
    found = _pick(table["default"].get(kernel, {}), shape_class)
    if found is None:
        raise ValueError(f"{CONFIG_FILE}: no default {kernel} config for shape class {shape_class!r}")
    return found


@contextmanager
def override(kernel: str, shape_class: str, config: dict):
    """Use `config` for (kernel, shape_class) inside the block (the tuner's candidates, tests' forced splits)."""
    before = _overrides.get((kernel, shape_class))
    _overrides[(kernel, shape_class)] = config
    try:
        yield
    finally:
        if before is None:
            _overrides.pop((kernel, shape_class), None)
        else:
            _overrides[(kernel, shape_class)] = before


def split_k(tiles: int, K: int, cfg: dict, device: torch.device) -> tuple[int, int]:
    """(splits, K per split): enough splits that tiles * splits reaches ctas_per_sm programs per SM, each split at
    least min_k_per_split deep and a whole number of BLOCK_K; the last split takes the remainder. A `split_k` in the
    config asks for that many splits (the same bounds apply)."""
    block_k = cfg["BLOCK_K"]
    want = cfg.get("split_k") or _cdiv(cfg["ctas_per_sm"] * num_sms(device), max(tiles, 1))
    splits = max(1, min(want, _cdiv(K, max(cfg["min_k_per_split"], block_k))))
    k_split = _cdiv(_cdiv(K, splits), block_k) * block_k
    return _cdiv(K, k_split), k_split
