"""A NamedTuple read through compiled/ref.py's Ref equals the tuple itself: every field type a State holds (bools,
ints, floats, arrays, nested tuples), at the byte offsets LLVM's own data layout gives, and writes to its arrays
land in the caller's arrays."""

from typing import NamedTuple

import llvmlite.binding as ll
import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.core.registry import cpu_target

from freetoken.placement.compiled.ref import Ref, _offsets, by_ref


class Inner(NamedTuple):
    flag: bool
    values: np.ndarray  # float64 [n]
    count: int


class Outer(NamedTuple):
    on: bool  # (an i1 before 8-byte fields: padding)
    inner: Inner
    ids: np.ndarray  # int32 [n]
    scale: float
    grid: np.ndarray  # int64 [r, c]
    small: np.int8
    mode: int


class Same(NamedTuple):
    """Fields of one type: numba lays it out as an LLVM array, not a struct (a pinned policy's State)."""

    first: np.ndarray  # int64 [n]
    second: np.ndarray  # int64 [n]


def _outer() -> Outer:
    return Outer(True, Inner(False, np.array([1.5, -2.25, 4.0]), 7), np.array([3, 1, 2], np.int32), 0.125,
                 np.arange(6, dtype=np.int64).reshape(2, 3), np.int8(-5), 42)


@numba.njit(cache=False)
def _read(t):
    r = by_ref(t)
    inner = r.inner  # a nested tuple: a Ref too
    return (r.on, inner.flag, inner.values[1], inner.count, r.ids[2], r.scale, r.grid[1, 2], r.small, r.mode,
            r.grid.shape[1], by_ref(r).mode)


@numba.njit(cache=False)
def _write(t):
    r = by_ref(t)
    r.inner.values[0] = 9.0
    r.grid[0, 1] = -1


def test_fields_read_through_a_ref_equal_the_tuples():
    t = _outer()
    assert _read(t) == (True, False, -2.25, 7, 2, 0.125, 5, -5, 42, 3, 42)


def test_writes_through_a_ref_reach_the_arrays():
    t = _outer()
    _write(t)
    assert t.inner.values[0] == 9.0 and t.grid[0, 1] == -1


def test_offsets_equal_llvms_data_layout():
    context = cpu_target.target_context
    target = ll.create_target_data(str(context.codegen()._data_layout))
    same = Same(np.zeros(2, np.int64), np.ones(3, np.int64))
    for tup in (numba.typeof(_outer()), numba.typeof(_outer().inner), numba.typeof(same)):
        llty = context.get_value_type(tup)
        if isinstance(llty, ir.ArrayType):  # one field type: element i at i x its allocation size
            step = target.get_abi_size(_parsed(llty.element))
            want = [i * step for i in range(len(tup.types))]
        else:
            want = [target.get_element_offset(_parsed(llty), i) for i in range(len(tup.types))]
        assert _offsets(context, tup) == want


def _parsed(llty):
    """`llty` as LLVM itself parses it (a binding type, for its data layout's answers)."""
    return ll.parse_assembly(f"@g = global {llty} zeroinitializer").get_global_variable("g").global_value_type


@numba.njit(cache=False)
def _read_same(t):
    r = by_ref(t)
    return r.second[2] + r.first.size


def test_a_tuple_of_one_field_type_reads_through_a_ref():
    assert _read_same(Same(np.zeros(2, np.int64), np.array([5, 6, 7], np.int64))) == 9


def test_a_ref_types_as_its_tuples_class():
    tup = numba.typeof(_outer())
    ref = Ref(tup)
    assert ref == Ref(numba.typeof(_outer())) and ref.instance_class is Outer
    assert isinstance(ref, types.Type) and len(str(ref)) < 64  # (its name is in every symbol that takes it)
