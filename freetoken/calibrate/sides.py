"""The sides `ft bench cpu` races: the live engine on the CPU, and HF transformers; each runs one greedy generation
of the same prompt ids per call (freetoken/calibrate/cpu_race.py), on the thread count it was given.

Threads are process-wide (torch's intra-op pool and the host kernels' count), so every side sets its own before
each run: sides with different thread counts can share one race.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from freetoken.calibrate.cpu_race import Sample, time_generation

DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


@dataclass(frozen=True, slots=True)
class FtMode:
    """How the engine places experts: what `ft generate` flags say (the peak-RSS child runs those flags) and the
    CacheConfig they become (tests/test_bench_cpu.py checks the two agree)."""

    name: str
    placement_flags: tuple[str, ...]  # where the experts go
    label: str
    lm_head: str = "checkpoint"  # the engine's lm_head (--lm-head)

    @property
    def flags(self) -> tuple[str, ...]:
        return self.placement_flags + (("--lm-head", self.lm_head) if self.lm_head != "checkpoint" else ())

    def cache(self):
        from freetoken.placement import CacheConfig, Split

        if self.name.startswith("cpu-moe"):
            return CacheConfig("static_layers", split=Split("cpu"), capacity=0, options={"n_cpu_layers": "all"})
        return CacheConfig("lru", fraction=1.0)


FT_MODES = {"cpu-moe": FtMode("cpu-moe", ("--cpu-moe",), "--cpu-moe"),
            "cpu-moe-int8-head": FtMode("cpu-moe-int8-head", ("--cpu-moe",), "--cpu-moe --lm-head int8", "int8"),
            "all": FtMode("all", ("--fraction", "1"), "--fraction 1")}


def set_threads(threads: int) -> None:
    from freetoken.engine.runtime import set_host_threads

    set_host_threads(threads)


def load_engine(ckpt, mode: FtMode, threads: int, max_context: int, dtype: str | None = None):
    """The engine on the CPU with its default kernels (the host kernels where they build) over a loaded checkpoint
    (several engines may share one: the weights are read, never changed)."""
    import torch

    from freetoken.engine import Engine

    return Engine(ckpt, mode.cache(), kernels="auto", device="cpu", dtype=getattr(torch, dtype) if dtype else None,
                  max_context=max_context, record=False, threads=threads, lm_head=mode.lm_head)


@dataclass(slots=True)
class EngineSide:
    name: str
    engine: object
    prompt: list[int]
    decode_tokens: int
    threads: int

    def run(self) -> Sample:
        set_threads(self.threads)
        e = self.engine
        e.reset()
        kv = e.new_kv(len(self.prompt) + self.decode_tokens + 1)
        return time_generation(lambda: e.prefill(self.prompt, kv)[-1].argmax(),
                               lambda t: e.decode(t, kv)[-1].argmax(), self.decode_tokens)


def load_hf(model: Path, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, DTYPES.get(dtype, dtype))).eval()


@dataclass(slots=True)
class HFSide:
    """HF transformers' own forward with its KV cache (and, for Qwen3.5, its recurrent state), greedy, the logits of
    the last position only (logits_to_keep=1, as HF's generate asks; ft computes only those too)."""

    name: str
    model: object
    prompt: list[int]
    decode_tokens: int
    threads: int

    def run(self) -> Sample:
        import torch

        set_threads(self.threads)
        state = {}

        def step(ids: list[int]) -> int:
            out = self.model(torch.tensor([ids]), cache=state.get("cache"), use_cache=True, logits_to_keep=1)
            state["cache"] = out.cache
            return int(out.logits[0, -1].argmax())

        with torch.inference_mode():
            return time_generation(lambda: step(self.prompt), lambda t: step([t]), self.decode_tokens)


def prompt_ids(tokens: int, seed: int = 0, high: int = 384) -> list[int]:
    """Random prompt ids in [1, high): ids of the demo tokenizer, which every side reads as the same tokens."""
    import numpy as np

    return np.random.default_rng(seed).integers(1, high, tokens).tolist()
