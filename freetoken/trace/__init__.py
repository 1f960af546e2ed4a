"""Routing traces: the format both the simulator and the live engine read and write."""

from freetoken.trace.format import (
    DECODE,
    FORMAT_VERSION,
    PREFILL,
    RoutingTrace,
    TraceError,
    load,
    save,
    validate,
)

__all__ = ["DECODE", "FORMAT_VERSION", "PREFILL", "RoutingTrace", "TraceError", "load", "save", "validate"]
