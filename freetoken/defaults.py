"""Defaults several layers share, in a root module without imports (the CLI reads them while building its parser)."""

import numbers
import os

DEFAULT_PREFILL_CHUNK = 2048  # tokens per prefill call: the engine's chunks and the simulator's calls
MAX_PREFILL_CHUNK = 2**31 - 1  # the compiled call-stream builders size their arrays in int32 / int64


def check_prefill_chunk(value, name: str) -> None:
    """A prefill chunk is a whole number of tokens in [1, MAX_PREFILL_CHUNK]; name: how the caller spells it."""
    if not (isinstance(value, numbers.Integral) and not isinstance(value, bool) and 0 < value <= MAX_PREFILL_CHUNK):
        raise ValueError(f"{name} must be a positive number of tokens, at most {MAX_PREFILL_CHUNK}, got {value}")


DEFAULT_CONTEXT = 4096  # an Engine's KV tokens without max_context: the model's own length, at most this


def context_length(config, max_context: int | None = None) -> int:
    """The tokens an Engine's KV cache holds for a ModelConfig (ft generate checks its prompt against it before the
    weights load)."""
    return max_context or min(config.max_position_embeddings, DEFAULT_CONTEXT)


def usable_cores() -> int:
    """The cores this process may run on (a container's CPU set, not the host's count): the default worker and
    reader counts."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1
