"""MODULES[name]: a module looked up by name on a hot path, imported on first use.

Why: an import statement (or importlib.import_module) runs the import machinery on every call, ~0.3 us even when
the module is loaded; a policy built per replay, or a replay of a few calls, pays that each time. A lookup here is
one dict lookup (~30 ns). Deferred too: the compiled placement (numba's compiled drivers) loads only once used.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class Modules(dict):
    """name -> module: sys.modules' module, kept here on the first lookup (imported then if not loaded)."""

    def __missing__(self, name: str) -> ModuleType:
        module = self[name] = importlib.import_module(name)
        return module


MODULES = Modules()
