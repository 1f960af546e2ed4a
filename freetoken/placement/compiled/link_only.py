"""Functions only ever called from compiled code, compiled as LLVM IR to link and no further.

numba finalises every function it compiles as if Python would call it: its module, with every callee's linked in,
optimised in full and turned into machine code. A caller links the callee's IR into its own module and optimises and
codegens it all again, so a helper under three levels of callers went through LLVM four times. Only the entry points
(called from Python: `jit(entry=True)`) run; the machine code of the rest was thrown away. Compiled with
LinkOnlyCompiler, a function's library keeps its per-function optimised IR for linking: no module pass (its entry's
full pass runs over it, inlined), no machine code, and the disk cache keeps that IR (kind LINK_ONLY) in place of
an object file. `ft warmup --all --jobs 1` on a 2-core machine: 34.7-39.2 -> 27.5-32.9 CPU-s.

install() patches numba's JIT code library for libraries so marked (every other library is left as numba builds it);
it is a no-op, and every function is finalised the usual way, where this numba lacks what it patches.
"""

from __future__ import annotations

import llvmlite.binding as ll
from numba.core import codegen
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import LoweringPass, register_pass
from numba.core.typed_passes import IRLegalization

LINK_ONLY = "freetoken-link-only"  # the disk cache's kind of such a library: (name, LINK_ONLY, bitcode)
_MARK = "_ft_link_only"
_Library = codegen.JITCodeLibrary
_NEEDS = ("_optimize_final_module", "_finalize_final_module", "_finalize_dynamic_globals",
          "_verify_declare_only_symbols", "serialize_using_object_code", "_unserialize")


@register_pass(mutates_CFG=False, analysis_only=True)
class _MarkLinkOnly(LoweringPass):
    _name = "freetoken_mark_link_only"

    def __init__(self):
        LoweringPass.__init__(self)

    def run_pass(self, state):
        if state.library is None:  # (made here as NativeLowering would make it, to carry the mark)
            state.library = state.targetctx.codegen().create_library(state.func_id.func_qualname)
            state.library.enable_object_caching()
        setattr(state.library, _MARK, True)
        return False


class LinkOnlyCompiler(CompilerBase):
    """numba's nopython pipeline, the function's library marked link-only before it is lowered."""

    def define_pipelines(self):
        pm = DefaultPassBuilder.define_nopython_pipeline(self.state)
        pm.add_pass_after(_MarkLinkOnly, IRLegalization)
        pm.finalize()
        return [pm]


def _link_only(library) -> bool:
    return getattr(library, _MARK, False)


def install() -> bool:
    """Patch numba's JIT library (once); False where this numba lacks a method it patches."""
    if getattr(_Library, "_ft_patched", False):
        return True
    if not all(hasattr(_Library, n) for n in _NEEDS) or not hasattr(codegen.JITCPUCodegen, "set_env"):
        return False
    optimize, finalize = _Library._optimize_final_module, _Library._finalize_final_module
    serialize, unserialize, set_env = _Library.serialize_using_object_code, _Library._unserialize.__func__, \
        codegen.JITCPUCodegen.set_env

    def _optimize_final_module(self):
        if not _link_only(self):
            optimize(self)

    def _finalize_final_module(self):
        if not _link_only(self):
            return finalize(self)
        self._finalize_dynamic_globals()
        self._verify_declare_only_symbols()
        self._finalized = True  # (no module in the JIT engine: nothing to codegen, no symbol to look up)
        return None

    def serialize_using_object_code(self):
        if not _link_only(self):
            return serialize(self)
        self._ensure_finalized()
        return self.name, LINK_ONLY, self._final_module.as_bitcode()

    def _unserialize(cls, codegen_, state):
        name, kind, data = state
        if kind != LINK_ONLY:
            return unserialize(cls, codegen_, state)
        self = codegen_.create_library(name)
        setattr(self, _MARK, True)
        self._final_module = ll.parse_bitcode(data)
        self._finalize_final_module()
        return self

    def set_env_where_defined(self, env_name, env):
        """numba's, skipping a link-only library's environment (not in the engine: no address to write to)."""
        if self._engine.get_global_value_address(env_name):
            set_env(self, env_name, env)

    _Library._optimize_final_module = _optimize_final_module
    _Library._finalize_final_module = _finalize_final_module
    _Library.serialize_using_object_code = serialize_using_object_code
    _Library._unserialize = classmethod(_unserialize)
    codegen.JITCPUCodegen.set_env = set_env_where_defined
    _Library._ft_patched = True
    return True
