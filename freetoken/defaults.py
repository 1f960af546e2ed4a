"""Defaults several layers share, in a root module without imports (the CLI reads them while building its parser)."""

DEFAULT_PREFILL_CHUNK = 2048  # tokens per prefill call: the engine's chunks and the simulator's calls
