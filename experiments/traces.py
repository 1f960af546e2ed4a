"""Load the trace a TraceSpec names: a saved file, an imported public format, or a synthetic spec; and what a sweep
derives from one trace many times (its call stream, a sample of it) kept for the process."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np

from freetoken.trace import RoutingTrace, load

T = TypeVar("T")
MEMO_SIZE = 64  # entries kept per process (oldest dropped first)
_MEMO: dict[tuple[int, object], tuple[object, object]] = {}  # (id(obj), what) -> (obj, value)


def memo(obj: object, what: object, build: Callable[[], T]) -> T:
    """build(), computed once per (obj, what) in this process. obj is held with the entry, so its id cannot be
    reused by another object while the entry lives; callers must not mutate obj afterwards (traces are not)."""
    key = (id(obj), what)
    hit = _MEMO.get(key)
    if hit is None or hit[0] is not obj:
        if len(_MEMO) >= MEMO_SIZE:
            _MEMO.pop(next(iter(_MEMO)))
        hit = _MEMO[key] = (obj, build())
    return hit[1]


def stream_of(trace: RoutingTrace, prefill_chunk: int):
    """The trace's CallStream at prefill_chunk, built once per process (every policy of a sweep replays it)."""
    from freetoken.sim.calls import trace_stream

    return memo(trace, ("stream", int(prefill_chunk)), lambda: trace_stream(trace, prefill_chunk))


def first_requests(trace: RoutingTrace, n: int) -> RoutingTrace:
    """The tokens of the first n requests, in order of first appearance."""
    _, first = np.unique(trace.request, return_index=True)
    keep = trace.request[np.sort(first)][:n]
    return trace.select(np.isin(trace.request, keep))


def load_trace(spec) -> RoutingTrace:
    if spec.synth is not None:
        trace = _synthesize(spec.synth)
    elif spec.format == "safetensors":
        trace = load(spec.path)
    else:
        trace = _import(spec.path, None if spec.format == "auto" else spec.format, spec.import_options)
    return trace if spec.requests is None else first_requests(trace, spec.requests)


def _synthesize(params: dict) -> RoutingTrace:
    from freetoken.sim.synth import SynthSpec, synthesize

    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}  # per-layer skews
    try:
        spec = SynthSpec(**fields)
    except TypeError as e:  # an unknown knob
        raise ValueError(f"trace.synth: {e}") from None
    except ValueError as e:
        raise ValueError(f"trace.synth: {e}") from None
    return synthesize(spec)


def _import(path: str, fmt: str | None, options: dict) -> RoutingTrace:
    from freetoken.trace.importers import import_trace

    return import_trace(path, fmt, **options)
