"""The live engine: HF MoE checkpoints, an expert slot cache driven by the simulator's placement policies."""

import freetoken.kernels  # noqa: F401  first: picks the Triton interpreter on CPU before anything imports triton

from freetoken.engine.cache import CacheConfig, ExpertCache
from freetoken.engine.engine import Engine, RunStats
from freetoken.engine.kv import KVCache
from freetoken.engine.sampling import Sampler, SamplingParams

__all__ = ["CacheConfig", "Engine", "ExpertCache", "KVCache", "RunStats", "Sampler",
           "SamplingParams"]
