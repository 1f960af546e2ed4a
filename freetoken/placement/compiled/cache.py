"""`jit`, the decorator of every compiled function of the placement, and where numba caches what it compiles.

numba stamps a cached function with its own source file only, so it misses an edit to a hook or a helper the cached
code calls in another file. A function decorated here is cached in cache_dir() and stamped with its own module (a
policy subpackage: every file of it) plus the engine room (this folder and call.py): an edit to one policy recompiles
that policy, an edit to the driver every one. `ft warmup` fills the cache; cold = an empty cache_dir().

The flags: no reference counting (_nrt=False: the compiled code never allocates, and numba then refuses to compile a
function that does), numpy's error model (no zero-division checks: every divisor here is a positive size), and no
C-callable wrapper (first-class function use is not needed; each one costs compile time). And calls between these
functions are typed with plain argument types (Dispatcher): numba would otherwise compile a copy of the callee per
constant argument (a 0, a True) and, for a counter that starts at 0, one for the literal 0 on its way to int64.
A function not called from Python (jit without entry=True, and every hook) is compiled to link-only IR
(link_only.py): LLVM works on it once, inside each entry point that calls it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numba
from numba.core import types
from numba.core.caching import CacheImpl, FunctionCache, _CacheLocator
from numba.core.registry import CPUDispatcher
from numba.core.runtime import rtsys

from freetoken.placement.compiled import link_only
from freetoken.placement.compiled.link_only import LinkOnlyCompiler

PLACEMENT = Path(__file__).resolve().parent.parent
ENGINE_ROOM = (*sorted(PLACEMENT.joinpath("compiled").glob("*.py")), PLACEMENT / "call.py")
POLICIES = PLACEMENT / "policies"
FLAGS = dict(cache=True, _nrt=False, error_model="numpy", no_cfunc_wrapper=True)
PIPELINE = {"pipeline_class": LinkOnlyCompiler} if link_only.install() else {}  # a function not called from Python
KEEP = 4  # compiled versions (stamps) kept per module
MARK = "_ft_cached"  # set on every function `jit` hands to numba: the locator below takes those


def cache_dir() -> Path:
    """$FT_CACHE_DIR, else ~/.cache/freetoken, + /numba; a temporary folder when neither can be written."""
    base = Path(os.environ.get("FT_CACHE_DIR") or Path.home() / ".cache" / "freetoken") / "numba"
    try:
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK):
            return base
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="ft-numba-"))


class LoadingCache(FunctionCache):
    """numba's disk cache of one function, loading compiled code without numba's refresh of its target context:
    the refresh imports every typing and lowering registry numba has (half of the numba modules a warm `ft sim`
    imported, ~0.15 s of its start), which only compiling needs (numba's compiler refreshes before it compiles).
    Loaded machine code needs the runtime (NRT) if it allocates, and nothing else."""

    def __init__(self, py_func, runtime: bool):
        super().__init__(py_func)
        self._runtime = runtime  # the code allocates (compiled with NRT): start it before loading

    def load_overload(self, sig, target_context):
        if self._runtime:
            rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)


class Dispatcher(CPUDispatcher):
    """numba's CPU dispatcher, typing a call from compiled code with the arguments' plain (non-literal) types, and
    cached by LoadingCache."""

    def get_call_template(self, args, kws):
        return super().get_call_template(tuple(types.unliteral(a) for a in args),
                                         {k: types.unliteral(v) for k, v in kws.items()})

    def enable_caching(self):
        self._cache = LoadingCache(self.py_func, self.targetoptions.get("_nrt", True))


def jit(fn=None, *, entry: bool = False, inline: bool = False, allocates: bool = False, per_policy: bool = False):
    """numba.njit with FLAGS, cached here. entry=True: called from Python (keeps the Python wrapper); inline=True:
    always inlined into its callers by LLVM (constant arguments folded there; numba types and lowers it once, not
    once per caller as its own inlining would); allocates=True: a set-up function that builds arrays (with reference
    counting; never called from the driver); per_policy=True: it calls hooks, so it is not cached on its own (its
    code is part of each policy's cached entry, driver.entry)."""
    def wrap(f):
        setattr(f, MARK, True)
        options = dict(FLAGS, nopython=True, _nrt=allocates, no_cpython_wrapper=not entry, inline="never",
                       forceinline=inline)
        del options["cache"]
        disp = Dispatcher(py_func=f, locals={}, targetoptions=options,
                          **({} if entry else PIPELINE))  # (link-only where install() took)
        if not per_policy:
            disp.enable_caching()
        return disp
    return wrap if fn is None else wrap(fn)


def stamped_files(module: str) -> list[Path]:
    """The files a compiled function of `module` depends on: its own (a policy subpackage's: all of them) and the
    engine room's."""
    own = Path(sys.modules[module].__file__).resolve()
    mine = sorted(own.parent.glob("*.py")) if own.parent.parent == POLICIES else [own]
    return [*mine, *ENGINE_ROOM]


def digest(files: list[Path]) -> str:
    """One hash of the files' contents (each read once per process while unchanged) and numba's version."""
    h = hashlib.sha256(numba.__version__.encode())
    for f in files:
        st = f.stat()
        h.update(_file_hash(f, st.st_mtime_ns, st.st_size))
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _file_hash(path: Path, mtime_ns: int, size: int) -> bytes:
    return hashlib.sha256(path.name.encode() + path.read_bytes()).digest()


class Locator(_CacheLocator):
    """numba's cache locator for the functions `jit` marked: a folder per module name and stamp, not per path, so
    every checkout and install of the same code (a wheel in a venv, a fresh clone) shares one compile. A changed
    source gets a fresh folder (no index that names a class since removed is ever read); a module keeps the KEEP
    latest (two checkouts at different commits do not evict each other's)."""

    def __init__(self, py_func):
        self._lineno = py_func.__code__.co_firstlineno
        self._py_file, self._stamp, self._path = _where(py_func.__module__)  # (numba's warnings name _py_file)

    def ensure_cache_path(self):
        if not self._path.is_dir():
            self._path.mkdir(parents=True, exist_ok=True)
            others = sorted((p for p in self._path.parent.iterdir() if p != self._path), key=_modified, reverse=True)
            for stale in others[KEEP - 1:]:
                shutil.rmtree(stale, ignore_errors=True)

    def get_cache_path(self):
        return str(self._path)

    def get_source_stamp(self):
        return self._stamp

    def get_disambiguator(self):
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file):
        return cls(py_func) if getattr(py_func, MARK, False) else None


@functools.lru_cache(maxsize=None)
def _where(module: str) -> tuple[str, str, Path]:
    """(source file, stamp, cache folder) of a module's compiled functions, once per process."""
    source = Path(sys.modules[module].__file__).resolve()
    stamp = digest(stamped_files(module))
    return str(source), stamp, cache_dir() / module / stamp[:16]


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile by another process
        return 0.0


if Locator not in CacheImpl._locator_classes:
    CacheImpl._locator_classes.insert(0, Locator)
