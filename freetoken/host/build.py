"""The host kernels (csrc/*.c) built with the system C compiler for this CPU, once, into the cache, and loaded.

Built per (sources, compiler, CPU flags): a rebuild follows any edit, compiler or machine change, never a stale
library. `-march=native` compiles path A (AVX512-BF16 dot products) where the CPU has it; the `generic` variant
leaves it out (the portable path: what other CPUs run, and a second oracle for the tests). Without a compiler the
engine keeps working on torch (freetoken.host.kernels says so once).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ("rows.c", "rows_avx512.c", "rows_int8.c", "rows_int8_avx2.c", "moe.c", "linear.c", "attention.c", "small.c",
           "step.c", "decode.c")
# -fno-trapping-math: float compares may be if-converted (no code here reads FP exception flags), so loops with
# clamps, such as ft_expf's, vectorise on AVX2 too; no reassociation beyond what `omp simd` loops already allow
FLAGS = ("-O3", "-fPIC", "-shared", "-fopenmp", "-std=gnu11", "-fno-trapping-math")
VARIANTS = {"native": ("-march=native",), "generic": ("-march=native", "-DFT_NO_AVX512")}

_LIBS: dict[str, ctypes.CDLL | None] = {}
_REASONS: dict[str, str] = {}
_LOCK = threading.Lock()


def cache_dir() -> Path:
    """$FT_CACHE_DIR/host, else ~/.cache/freetoken/host (the compiled policies' cache sits beside it)."""
    return Path(os.environ.get("FT_CACHE_DIR") or Path.home() / ".cache" / "freetoken") / "host"


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _key(cc: str, variant: str) -> str:
    h = hashlib.sha256()
    for name in SOURCES + ("ftk.h", "rows_avx512.h", "rows_int8.h", "rows_int8_driver.h", "arena.h", "fastmath.h"):
        h.update((CSRC / name).read_bytes())
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = cc
    h.update(version.encode())
    h.update(" ".join(FLAGS + VARIANTS[variant]).encode())
    h.update(_cpu_flags().encode())
    return h.hexdigest()[:16]


def _compile(cc: str, variant: str, out: Path) -> str | None:
    """Build into `out` (atomically: parallel processes never load a half-written file); an error line or None."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [cc, *FLAGS, *VARIANTS[variant], *(str(CSRC / s) for s in SOURCES), "-o", tmp, "-lm"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        os.unlink(tmp)
        return f"{cc} failed to run ({e})"
    if done.returncode != 0:
        os.unlink(tmp)
        first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:200])
        return f"{cc} could not build the host kernels: {first}"
    os.replace(tmp, out)
    return None


def load(variant: str = "native") -> ctypes.CDLL | None:
    """The built library (building it on first use), or None with unavailable_reason(variant) saying why."""
    if variant not in VARIANTS:
        raise ValueError(f"host kernel variant {variant!r} is not one of {', '.join(VARIANTS)}")
    with _LOCK:
        if variant in _LIBS:
            return _LIBS[variant]
        lib, reason = None, None
        if os.environ.get("FT_HOST_KERNELS", "").lower() in ("0", "off", "torch"):
            reason = "FT_HOST_KERNELS=off"
        elif (cc := compiler()) is None:
            reason = "no C compiler found (set CC, or install gcc)"
        else:
            path = cache_dir() / f"libfthost-{variant}-{_key(cc, variant)}.so"
            if not path.is_file():
                reason = _compile(cc, variant, path)
            if reason is None:
                try:
                    lib = ctypes.CDLL(str(path))
                except OSError as e:
                    reason = f"{path}: could not be loaded ({e})"
        _LIBS[variant], _REASONS[variant] = lib, reason or ""
        return lib


def unavailable_reason(variant: str = "native") -> str | None:
    load(variant)
    return _REASONS[variant] or None
