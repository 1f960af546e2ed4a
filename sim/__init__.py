"""Trace-replay simulator: the same placement policies as the engine, counted instead of executed."""

from freetoken.sim.calls import DEFAULT_PREFILL_CHUNK, trace_calls
from freetoken.sim.replay import Counts, ReplayLog, ReplayResult, replay

__all__ = ["Counts", "DEFAULT_PREFILL_CHUNK", "ReplayLog", "ReplayResult", "replay", "trace_calls"]
