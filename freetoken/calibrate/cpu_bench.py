"""What both `ft bench cpu` comparisons share: the run's settings, rates from a race's tallies, the machine's load.

Rates are best of N (each side's fastest prefill and fastest decode over the timed rounds), medians beside them.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Iterator

from freetoken.calibrate.cpu_race import Tally

MiB = 1 << 20
# progress(total, description) -> a context yielding advance(): the CLI's bar (freetoken/cli/common.py progress)
Progress = Callable[[int, str], ContextManager[Callable[[], None]]]
Log = Callable[[str], None]


@contextmanager
def no_progress(total: int, description: str) -> Iterator[Callable[[], None]]:
    yield lambda: None


def default_work_dir() -> Path:
    from freetoken.calibrate.profile import cache_dir

    return cache_dir() / "bench-cpu"


@dataclass(frozen=True, slots=True)
class CpuBenchConfig:
    """Settings both comparisons share; errors name the `ft bench cpu` flag."""

    prompt_tokens: tuple[int, ...] = (512,)
    decode_tokens: int = 32
    reps: int = 3  # timed rounds (best of N)
    warmup: int = 1  # untimed rounds first
    threads: tuple[int, ...] = (1,)
    rss: bool = True  # peak RSS of each side in a child process
    seed: int = 0  # of the prompt ids
    read_seconds: float = 0.3  # per memory-bandwidth reading (one per timed round and thread count)
    read_buffer_bytes: int = 512 * MiB
    work_dir: Path = Path()  # built checkpoints, GGUF files, llama.cpp's converter

    def __post_init__(self) -> None:
        for flag, values in (("--prompt-tokens", self.prompt_tokens), ("--threads", self.threads)):
            if not values or any(v <= 0 for v in values):
                raise ValueError(f"{flag} must list positive integers, got {','.join(map(str, values)) or 'none'}")
            if len(set(values)) != len(values):
                raise ValueError(f"{flag} lists a value twice: {','.join(map(str, values))}")
        for flag, value in (("--decode-tokens", self.decode_tokens), ("--reps", self.reps)):
            if value <= 0:
                raise ValueError(f"{flag} must be positive, got {value}")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be 0 or more, got {self.warmup}")

    @property
    def context(self) -> int:
        """KV positions every side allocates: the longest prompt, its decode tokens, a little room."""
        return max(self.prompt_tokens) + self.decode_tokens + 8

    @property
    def read_threads(self) -> list[int]:
        """Thread counts the read bandwidth is measured at: 1 and each one used."""
        return sorted(set(self.threads) | {1})


def rates(t: Tally, prompt_tokens: int, decode_tokens: int) -> dict:
    return {"decode_tok_s": decode_tokens / t.best_decode_s, "prefill_tok_s": prompt_tokens / t.best_prefill_s,
            "decode_tok_s_median": decode_tokens / t.median_decode_s,
            "prefill_tok_s_median": prompt_tokens / t.median_prefill_s, "runs": len(t.samples),
            "tokens_stable": t.stable}


def machine() -> dict:
    """What the numbers ran on, and how busy it was (other processes share a machine's cores)."""
    from freetoken.host import kernels as hk

    return {"cpus": os.cpu_count(), "physical_cores": hk.physical_cores(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "int4_activations": f"int8 ({q})" if (q := hk.path_q()) else "bf16"}
