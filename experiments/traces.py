"""Load the trace a TraceSpec names: a saved file, an imported public format, or a synthetic spec."""

from __future__ import annotations

import numpy as np

from freetoken.trace import RoutingTrace, load


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
