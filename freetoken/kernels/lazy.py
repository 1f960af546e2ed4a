"""Triton loaded at a kernel's first launch, not when a kernel file is imported.

The CPU engine runs the torch references and host kernels that sit beside the Triton kernels, and never launches
one; `import triton` alone costs it ~0.15 s and ~73 MB resident (libtriton.so; measured on this project's 2-core
machine). A kernel file takes `triton` and `tl` from here: stand-ins that import the real module on first attribute
use. `@triton.jit` through them keeps the function and its options (a LazyKernel), and `tl.constexpr(v)` at file
level keeps v. At its first launch or attribute read (`arg_names`, `run`, ...) a LazyKernel builds the real
JITFunction, then swaps the stand-ins, the constexprs and the other LazyKernels in its file's globals for the real
ones (the kernels it calls included), so Triton compiles from real globals and later launches go straight to Triton.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any


class _Module:
    """`triton` or `triton.language` until first use."""

    def __init__(self, name: str):
        self.module_name, self._module = name, None

    def __getattr__(self, attr: str) -> Any:
        if attr == "jit" and self.module_name == "triton":
            return jit
        if attr == "constexpr" and self.module_name == "triton.language":
            return Constexpr
        if self._module is None:
            self._module = importlib.import_module(self.module_name)
        return getattr(self._module, attr)


triton = _Module("triton")
tl = _Module("triton.language")


class Constexpr:
    """A file-level `tl.constexpr(value)`, made real when a kernel of the file is."""

    def __init__(self, value: Any):
        self.value = value


class LazyKernel:
    """A `@triton.jit` function until it is first used."""

    def __init__(self, fn, options: dict):
        functools.update_wrapper(self, fn)
        self.fn, self.options, self._real = fn, options, None

    def materialise(self):
        """The real JITFunction (or InterpretedFunction under TRITON_INTERPRET=1), built once."""
        if self._real is None:
            from freetoken.kernels.checks import interpreting

            if interpreting():
                from freetoken.kernels.interpreter import install

                install()
            self._real = importlib.import_module("triton").jit(self.fn, **self.options)
            bind(self.fn.__globals__)
        return self._real

    def __getitem__(self, grid):
        return self.materialise()[grid]

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.materialise(), attr)


def jit(fn=None, **options):
    """triton.jit, deferred: `@triton.jit` and `@triton.jit(do_not_specialize=[...])` alike."""
    if fn is None:
        return lambda f: LazyKernel(f, options)
    return LazyKernel(fn, options)


_BOUND: set[int] = set()  # ids of the globals dicts already swapped


def bind(namespace: dict) -> None:
    """Swap a kernel file's stand-ins for the real modules, constexprs and kernels (once per file)."""
    if id(namespace) in _BOUND:
        return
    _BOUND.add(id(namespace))
    for name, value in list(namespace.items()):
        if isinstance(value, _Module):
            namespace[name] = importlib.import_module(value.module_name)
        elif isinstance(value, Constexpr):
            namespace[name] = importlib.import_module("triton.language").constexpr(value.value)
    for name, value in list(namespace.items()):
        if isinstance(value, LazyKernel):
            namespace[name] = value.materialise()


def real(kernel):
    """The Triton function behind a kernel (a LazyKernel's, built now); anything else as it is."""
    return kernel.materialise() if isinstance(kernel, LazyKernel) else kernel
