"""A NamedTuple handed to compiled callees by address: `by_ref(p)` once in the driver, then `p.field` reads as before.

numba passes a NamedTuple by value, flattened: a policy's State of ~40 arrays is ~280 machine arguments, written out
in every hook's signature, unpacked at its entry and repacked at each call. That plumbing, not the hooks' own code,
was most of the LLVM IR text numba generated, printed and parsed for a policy: 9.3 MB for the layer-sweep family,
2.2 MB with its State, Core and scratch passed by address. Ref(T) is one pointer to the caller's copy (on the
driver's stack: it outlives every call made under the driver). Its fields are read-only, as a NamedTuple's are; the
arrays in them are written in place.
"""

from __future__ import annotations

import hashlib

from llvmlite import ir
from numba.core import cgutils, types
from numba.core.imputils import impl_ret_borrowed
from numba.core.typing.templates import AttributeTemplate, infer_getattr
from numba.extending import intrinsic, lower_getattr_generic, models, register_model


class Ref(types.Type):
    """The address of a BaseNamedTuple value (`inner`), typed as the tuple for attribute reads."""

    def __init__(self, inner: types.BaseNamedTuple):
        self.inner = inner  # (named by a digest: the name is in every symbol taking a Ref, the tuple's is ~1 KB)
        digest = hashlib.sha1(str(inner).encode()).hexdigest()[:16]
        super().__init__(name=f"Ref({inner.instance_class.__qualname__}:{digest})")

    @property
    def key(self):
        return self.inner

    @property
    def instance_class(self):  # (hooks.overridable resolves a call by the State's class)
        return self.inner.instance_class


BYTES = ir.IntType(8).as_pointer()


@register_model(Ref)
class _RefModel(models.PrimitiveModel):
    """An untyped address (i8*): a typed one spells the whole tuple's LLVM type at each use, ~4 KB of IR text."""

    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, BYTES)


@infer_getattr
class _RefAttributes(AttributeTemplate):
    key = Ref

    def generic_resolve(self, ref, attr):
        inner = ref.inner
        if attr in inner.fields:
            return _field_type(inner.types[inner.fields.index(attr)])
        return None


def _field_type(ty):
    """A field as read through a Ref: a nested tuple by address too."""
    return Ref(ty) if isinstance(ty, types.BaseNamedTuple) else ty


@lower_getattr_generic(Ref)
def _get_field(context, builder, ref, value, attr):
    field = ref.inner.fields.index(attr)
    ty = ref.inner.types[field]
    at = builder.gep(value, [ir.Constant(ir.IntType(64), _offsets(context, ref.inner)[field])], inbounds=True)
    if isinstance(ty, types.BaseNamedTuple):
        return at
    got = builder.load(builder.bitcast(at, context.get_value_type(ty).as_pointer()))
    return impl_ret_borrowed(context, builder, ty, got)


def _offsets(context, tup) -> list[int]:
    """Byte offset of each field in the tuple's LLVM value (a non-packed struct, or an array of one type). Once per
    tuple type: llvmlite sizes a type by parsing a module that declares it (~4 ms for a State)."""
    if tup in _OFFSETS:
        return _OFFSETS[tup]
    offsets, end = [], 0
    for ty in tup.types:
        llty = context.get_value_type(ty)
        align = context.get_abi_alignment(llty)
        start = -(-end // align) * align
        offsets.append(start)
        end = start + context.get_abi_sizeof(llty)
    _OFFSETS[tup] = offsets
    return offsets


_OFFSETS: dict[types.BaseNamedTuple, list[int]] = {}


@intrinsic
def by_ref(typingctx, tup):
    """`tup` (a NamedTuple) as a Ref to a copy on the caller's stack; a Ref is returned as it is."""
    if isinstance(tup, Ref):
        return tup(tup), lambda context, builder, sig, args: args[0]
    if not isinstance(tup, types.BaseNamedTuple):
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(cgutils.alloca_once_value(builder, args[0]), BYTES)

    return Ref(tup)(tup), codegen
