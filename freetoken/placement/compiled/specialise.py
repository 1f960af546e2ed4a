"""One driver per policy: a copy of driver.py whose hooks import names the policy's module, written once to a
cache directory so numba's on-disk cache holds each policy's compiled loop.

Why a file per policy: numba's cache cannot key a function on a dispatcher passed as an argument or closed over
(the key holds the object's address, so every process compiles again), and it does not notice when a function in
another file changes. The copy's name carries a hash of this package's sources, so editing any hook or the driver
gives a new file and a fresh compile; unchanged sources load from cache in well under a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import numba

HERE = Path(__file__).resolve().parent
TEMPLATE_IMPORT = "from freetoken.placement.compiled.lru import ("
_DRIVERS: dict[str, object] = {}


def cache_dir() -> Path:
    """$FT_CACHE_DIR, else ~/.cache/freetoken; a temporary directory when neither is writable."""
    base = Path(os.environ.get("FT_CACHE_DIR") or Path.home() / ".cache" / "freetoken") / "compiled"
    try:
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK):
            return base
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="ft-compiled-"))


def _sources_digest() -> str:
    h = hashlib.sha256(numba.__version__.encode())
    for f in sorted(HERE.glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def driver_for(module: str):
    """The driver module (apply_call, replay_calls) specialised on the hooks of `module` (a dotted name)."""
    if module not in _DRIVERS:
        template = (HERE / "driver.py").read_text()
        if TEMPLATE_IMPORT not in template:
            raise RuntimeError(f"{HERE / 'driver.py'}: the hooks import line {TEMPLATE_IMPORT!r} is missing")
        source = template.replace(TEMPLATE_IMPORT, f"from {module} import (")
        _DRIVERS[module] = _load_copy(f"driver_{module.rsplit('.', 1)[-1]}", source)
    return _DRIVERS[module]


def stream_for(filename: str):
    """A policy's own stream replay (a file of this package with replay_calls, e.g. lru_stream.py), loaded as a
    digest-named copy like the drivers, so an edit to any file it imports recompiles it."""
    if filename not in _DRIVERS:
        _DRIVERS[filename] = _load_copy(Path(filename).stem, (HERE / filename).read_text())
    return _DRIVERS[filename]


def _load_copy(short: str, source: str):
    name = f"ft_{short}_{_sources_digest()}"
    path = cache_dir() / f"{name}.py"
    if not path.is_file() or path.read_text() != source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
