"""Triton's interpreter, made cheaper to launch: on each kernel launch and each call of a `@triton.jit` helper it
scans `triton.language` (four `inspect.getmembers` passes: dir, getattr and a sort of every member, ~1.3 ms) for the
builtins to wrap. The builtins are the same every time, so they are listed once per module here and wrapped from
the list; the wrapping and its undoing stay Triton's own (`_patch_attr`, the launch's patch scope)."""

from __future__ import annotations

import inspect

_BUILTINS: dict[int, list] = {}  # id(module or class) -> [(name, builtin)]


def _builtins(pkg, is_builtin) -> list:
    got = _BUILTINS.get(id(pkg))
    if got is None:
        got = [(name, member) for name, member in inspect.getmembers(pkg) if is_builtin(member)]
        if got:  # (inside a launch the members are wrapped already and none looks builtin: nothing to keep)
            _BUILTINS[id(pkg)] = got
    return got


def install() -> bool:
    """Replace the interpreter's scan by the cached list; False where this Triton has no such scan to replace."""
    try:
        from triton.runtime import interpreter
        from triton.language.core import is_builtin
    except ImportError:
        return False
    patch_attr = getattr(interpreter, "_patch_attr", None)
    if patch_attr is None or not callable(getattr(interpreter, "_patch_builtin", None)):
        return False
    if getattr(interpreter._patch_builtin, "_cached", False):
        return True

    def patch_builtin(pkg, builder, scope):
        for name, member in _builtins(pkg, is_builtin):
            if getattr(pkg, name, None) is member:  # (not wrapped by an enclosing launch already: as Triton's scan)
                patch_attr(pkg, name, member, builder, scope)

    patch_builtin._cached = True
    patch_builtin.original = interpreter._patch_builtin
    interpreter._patch_builtin = patch_builtin
    return True
