"""Peak resident memory of one side, each in a fresh child process that loads it and runs one generation.

The races run every side in one process, where no side's peak can be told apart; so each side is also run alone in
a child: ft as `ft generate` with the mode's flags, llama.cpp and HF through the same classes the race uses. The
child reports its own VmHWM (the high-water mark of its resident set since exec; ru_maxrss could carry the parent's
peak across fork + exec). Pages of a memory-mapped file count once touched, as they do for llama.cpp's GGUF.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Sequence

_REPORT = "print('VMHWM_KIB', [int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM')][0])"


def peak_rss_bytes(code: str, what: str) -> int:
    """Runs `code` in a fresh interpreter; its peak resident bytes, or a one-line error naming `what`."""
    done = subprocess.run([sys.executable, "-c", f"{code}\n{_REPORT}"], capture_output=True, text=True)
    lines = [x for x in done.stdout.splitlines() if x.startswith("VMHWM_KIB")]
    if done.returncode != 0 or not lines:
        err = done.stderr.strip().splitlines()
        said = [x for x in err if ": error: " in x]  # the CLI's own one-line error, not the assert after it
        last = (said or err or [f"exit status {done.returncode}"])[-1]
        raise ValueError(f"peak RSS of {what}: the child run failed: {last}")
    return int(lines[-1].split()[1]) * 1024


def ft_generate_code(model: str, flags: Sequence[str], prompt: list[int], decode_tokens: int, threads: int,
                     dtype: str | None = None) -> str:
    argv = ["generate", "--model", model, *flags, "--token-ids", ",".join(map(str, prompt)),
            "--max-tokens", str(decode_tokens + 1), "--greedy", "--threads", str(threads), "--device", "cpu",
            "--max-context", str(len(prompt) + decode_tokens + 8), "--stop-token-ids", "-1", "--json"]
    if dtype:
        argv += ["--dtype", dtype]
    return f"from freetoken.cli import main\nassert main({json.dumps(argv)}) == 0"


def ft_generate_rss(model: str, flags: Sequence[str], prompt: list[int], decode_tokens: int, threads: int,
                    dtype: str | None = None) -> int:
    """`ft generate` with these flags on the prompt ids, the same number of tokens as a timed run."""
    code = ft_generate_code(model, flags, prompt, decode_tokens, threads, dtype)
    return peak_rss_bytes(code, f"ft generate {' '.join(flags)} on {model}")


def ft_process_rss(flags: Sequence[str], prompt: list[int], decode_tokens: int, threads: int) -> int:
    """The fixed cost of an `ft generate` process: the same run on the shipped tiny demo model (a few MB of
    weights), so the interpreter, torch, numba and the compiled placement code it loads are what it measures."""
    from freetoken.models.checkpoint import read_config
    from freetoken.paths import DEMO_MODEL

    vocab = read_config(DEMO_MODEL)[1].vocab_size
    return ft_generate_rss(str(DEMO_MODEL), flags, [i % vocab for i in prompt], decode_tokens, threads)


def checkpoint_bytes(path: str) -> int:
    """Bytes of the weights a side loads: a GGUF file, or a folder's safetensors files."""
    from pathlib import Path

    p = Path(path)
    return p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.glob("*.safetensors"))


def hf_rss(model: str, dtype: str, prompt: list[int], decode_tokens: int, threads: int) -> int:
    code = ("from freetoken.calibrate.sides import HFSide, load_hf\n"
            f"HFSide('hf', load_hf({model!r}, {dtype!r}), {prompt!r}, {decode_tokens}, {threads}).run()")
    return peak_rss_bytes(code, f"HF transformers on {model}")


def llamacpp_rss(gguf: str, prompt: list[int], decode_tokens: int, threads: int) -> int:
    code = ("from freetoken.calibrate.llamacpp import LlamaCppSide\n"
            f"LlamaCppSide.load('llama.cpp', {gguf!r}, {prompt!r}, {decode_tokens}, {threads}).run()")
    return peak_rss_bytes(code, f"llama.cpp on {gguf}")
