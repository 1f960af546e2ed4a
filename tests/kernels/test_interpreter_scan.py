"""freetoken/kernels/interpreter.py: the interpreter's scan of triton.language for builtins, listed once, wraps
exactly what Triton's own scan wraps, at a launch and inside one (where it wraps nothing), and leaves the modules as
they were once the launch's scope is undone."""

from __future__ import annotations

import pytest

from freetoken.kernels.checks import interpreting


def _scan_targets():
    import triton.language as tl

    return [tl, tl.tensor, tl.math, tl.core.tensor_descriptor_base]


def _wrapped(patch, pkgs, scope_cls):
    """(pkg, name) pairs `patch` wraps, and the scope that undoes them."""
    from triton.runtime import interpreter

    scope = scope_cls()
    for pkg in pkgs:
        patch(pkg, interpreter.interpreter_builder, scope)
    return [(id(obj), name) for obj, name, _ in scope._changes], scope


def test_the_listed_scan_wraps_what_tritons_scan_wraps():
    if not interpreting():
        pytest.skip("kernels compiled for a GPU: no interpreter to speed up")
    from freetoken.kernels.interpreter import install
    from triton.runtime import interpreter

    if not install():
        pytest.skip("this Triton's interpreter has no scan of its own to replace")
    cached, original, scope_cls = interpreter._patch_builtin, interpreter._patch_builtin.original, \
        interpreter._LangPatchScope
    pkgs = _scan_targets()
    before = {(id(p), n): getattr(p, n) for p in pkgs for n in dir(p)}

    want, scope = _wrapped(original, pkgs, scope_cls)
    scope.restore()
    got, scope = _wrapped(cached, pkgs, scope_cls)
    assert got == want and len(want) > 100  # (tl alone has well over 100 builtins)
    # inside a launch (a @triton.jit helper's call): both wrap nothing more
    assert _wrapped(original, pkgs, scope_cls)[0] == [] and _wrapped(cached, pkgs, scope_cls)[0] == []
    scope.restore()
    assert {(id(p), n): getattr(p, n) for p in pkgs for n in dir(p)} == before
