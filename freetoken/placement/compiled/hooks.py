"""The hooks a compiled policy writes, and how compiled code reaches them: a method call, resolved by the State's type.

A policy's compiled half (below the banner of its file in freetoken/placement/policies/) is a NamedTuple of its
arrays, its State, with fields named as the reference's attributes, and some of these functions over it, plain
Python that numba compiles when the driver is first compiled for that State:

    begin_call(p, st, c, keys, tokens, phase)  call c's keys [n] (one layer's), tokens [n], phase; before any applies
    on_hit(p, key, now)  on_miss(p, key, now)  on_admit(p, key, now)  on_evict(p, key)  on_prefetch(p, key, now)
    victim(p, st, key, now) -> key       a resident key k with not is_protected(st, k), or -1: `key` is not cached
    admission_order(p, keys, n, order)   (orders_admission) order[:n]: the order keys[:n], the fetched, get slots
    prefetch_for(p, st, c, keys, out) -> n   (prefetches) out[:n]: keys to copy ahead, most wanted first

p is the State, st the Core (read only: the driver owns residency and clocks), both passed by address (ref.py).
Hooks allocate nothing (the driver is compiled without reference counting): every array a policy needs is in its
State, sized by its setup().

Each name is an `overridable`: compiled code calls it with a State first, and numba's overload resolves the call by
that State's type to the function register() gave it, else to the default below (a no-op). So the driver is
written once and compiled once per policy, and a policy family can declare methods of its own the same way
(policies/sweep/layer_sweep.py: a wait that lookahead and hinted_sweep override, as their reference classes do).
"""

from __future__ import annotations

from numba.extending import overload

from freetoken.placement.compiled.cache import FLAGS, PIPELINE

HOOK_FLAGS = {k: v for k, v in FLAGS.items() if k != "cache"} | {"no_cpython_wrapper": True, **PIPELINE}
_IMPLS: dict[tuple[type, object], object] = {}  # (State class, overridable) -> its function


def overridable(default):
    """Declare `default`'s name as a method of compiled States: returns the name to call (from compiled code only)."""
    def stub(p, *args):
        raise TypeError(f"{default.__name__} runs in compiled code only")

    def resolve(p, *args):  # numba types of the call's arguments -> the function to compile for them
        fn = _IMPLS.get((getattr(p, "instance_class", None), stub), default)
        return getattr(fn, "py_func", fn)  # (one also decorated with `jit`: its Python function)

    stub.__name__ = stub.__qualname__ = default.__name__
    stub.__doc__, stub.default = default.__doc__, default
    overload(stub, jit_options=HOOK_FLAGS, strict=False)(resolve)
    return stub


def register(state: type, methods: dict) -> None:
    """A `state` instance's methods: {overridable (or a hook's name): function}; the rest keep their defaults."""
    for key, fn in methods.items():
        name = key if isinstance(key, str) else key.__name__
        if (HOOKS.get(name) if isinstance(key, str) else key) is None:
            raise ValueError(f"{state.__qualname__}: no hook named {name}; the hooks are: {', '.join(HOOKS)}")
        _IMPLS[state, HOOKS[key] if isinstance(key, str) else key] = fn


# the driver's hooks, with their defaults
@overridable
def begin_call(p, st, c, keys, tokens, phase):
    pass


@overridable
def on_hit(p, key, now):
    pass


@overridable
def on_miss(p, key, now):
    pass


@overridable
def on_admit(p, key, now):
    pass


@overridable
def on_evict(p, key):
    pass


@overridable
def on_prefetch(p, key, now):
    pass


@overridable
def victim(p, st, key, now):
    return -1  # nothing to evict: the key is not cached


@overridable
def admission_order(p, keys, n, order):
    for i in range(n):  # call order
        order[i] = i


@overridable
def prefetch_for(p, st, c, keys, out):
    return 0


HOOKS = {f.__name__: f for f in (begin_call, on_hit, on_miss, on_admit, on_evict, on_prefetch, victim,
                                 admission_order, prefetch_for)}
