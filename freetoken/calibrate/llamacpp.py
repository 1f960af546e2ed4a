"""llama.cpp beside ft on the same weights: its own HF -> GGUF converter, its quantizer, and a timed greedy run
through llama-cpp-python (optional: never a dependency of freetoken, its tests or CI).

The converter is `convert_hf_to_gguf.py` of a llama.cpp source tree: given (--llama-cpp-src / $FT_LLAMA_CPP_SRC),
else the one inside the llama-cpp-python sdist of the installed version, downloaded once into the cache with pip.
It runs in a child through a small wrapper: the converter refuses a BPE tokenizer whose pre-tokenizer it cannot
identify by hash, and the benchmark's tokenizer (the demo's byte-level BPE) splits as qwen2's does, so the wrapper
names it ("qwen2"). Quantization (Q8_0, Q4_0, Q4_K_M) is `llama_model_quantize`, also in a child (its log would
otherwise flood the terminal).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from freetoken.calibrate.cpu_race import Sample, time_generation

ENV_SRC = "FT_LLAMA_CPP_SRC"
QUANTS = {"Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}
CONVERTER = "convert_hf_to_gguf.py"
KEEP = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")  # what the converter needs from the source tree
PRE_TOKENIZER = "qwen2"

_WRAPPER = r"""
import sys
src, model, out, outtype, pre = sys.argv[1:6]
sys.path.insert(0, src)
try:  # llama.cpp since 2025 keeps its model classes in a package
    from conversion.base import TextModel
except ImportError:
    from convert_hf_to_gguf import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py", model, "--outfile", out, "--outtype", outtype]
convert_hf_to_gguf.main()
"""


def require_llama_cpp():
    """llama_cpp, or the one-line reason it cannot be used."""
    try:
        import llama_cpp
    except ImportError as e:
        raise ValueError(f"--against llama.cpp needs llama-cpp-python, which cannot be imported here ({e}); "
                         f"install it (pip install llama-cpp-python) to run this comparison") from None
    return llama_cpp


def _tree(path: Path) -> Path | None:
    """The llama.cpp folder holding the converter: path itself, or an sdist's vendor/llama.cpp."""
    for d in (path, path / "vendor" / "llama.cpp"):
        if (d / CONVERTER).is_file():
            return d
    return None


def converter_source(given: str | None, cache: Path, log: Callable[[str], None] = lambda s: None) -> Path:
    """The llama.cpp source tree to convert with: `given` (the flag), $FT_LLAMA_CPP_SRC, else the installed
    llama-cpp-python's sdist, downloaded into `cache` once."""
    for value, where in ((given, "--llama-cpp-src"), (os.environ.get(ENV_SRC), f"${ENV_SRC}")):
        if value:
            tree = _tree(Path(value).expanduser())
            if tree is None:
                raise ValueError(f"{where} {value}: no {CONVERTER} there (nor in vendor/llama.cpp under it)")
            return tree
    version = require_llama_cpp().__version__
    dest = cache / f"llama-cpp-python-{version}"
    tree = _tree(dest)
    if tree is not None:
        return tree
    log(f"downloading the llama-cpp-python {version} sdist (its {CONVERTER}) with pip")
    dl = cache / "download"
    done = subprocess.run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={version}", "--no-deps",
                           "--no-binary", ":all:", "--dest", str(dl)], capture_output=True, text=True)
    found = sorted(dl.glob(f"llama_cpp_python-{version}.tar.gz"))
    if done.returncode != 0 or not found:
        last = (done.stderr.strip().splitlines() or ["no sdist downloaded"])[-1]
        raise ValueError(f"cannot fetch llama.cpp's converter ({last}); give a llama.cpp source tree with "
                         f"--llama-cpp-src")
    extract_converter(found[0], dest)
    tree = _tree(dest)
    if tree is None:
        raise ValueError(f"{found[0]}: no vendor/llama.cpp/{CONVERTER} in this sdist")
    return tree


def extract_converter(sdist: Path, dest: Path) -> None:
    """Only the converter's files of the sdist (its C sources are not needed here)."""
    tmp = dest.with_name(dest.name + ".partial")
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            parts = m.name.split("/", 1)
            rel = parts[1] if len(parts) == 2 else ""
            inner = rel.removeprefix("vendor/llama.cpp/")
            if rel != inner and any(inner == k or (k.endswith("/") and inner.startswith(k)) for k in KEEP):
                m.name = rel
                members.append(m)
        tar.extractall(tmp, members=members, filter="data")
    tmp.rename(dest)


def convert(src: Path, model: Path, out: Path, outtype: str = "bf16") -> Path:
    """HF checkpoint -> GGUF with llama.cpp's converter (written beside `out`, renamed when complete)."""
    tmp = out.with_name(out.name + ".partial")
    done = subprocess.run([sys.executable, "-c", _WRAPPER, str(src), str(model), str(tmp), outtype, PRE_TOKENIZER],
                          capture_output=True, text=True)
    if done.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise ValueError(f"llama.cpp's converter ({src / CONVERTER}) failed on {model}: {last}")
    tmp.rename(out)
    return out


def child_failure(done: subprocess.CompletedProcess) -> str:
    """Why a llama.cpp child failed: the signal that killed it (SIGILL: a build for another CPU), else its last
    stderr line (a killed child's last line is only llama.cpp's loader log)."""
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        if name == "SIGILL":
            return ("killed by SIGILL (an illegal instruction): this llama-cpp-python was built for a CPU with "
                    "instructions this one lacks; build it here: CMAKE_ARGS=-DGGML_NATIVE=ON pip install "
                    "llama-cpp-python --no-binary llama-cpp-python")
        return f"killed by {name}"
    return (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]


def quantize(src: Path, out: Path, kind: str, threads: int) -> Path:
    """llama_model_quantize(src -> out) to Q8_0 / Q4_0 / Q4_K_M, in a child process."""
    if kind not in QUANTS:
        raise ValueError(f"quantization {kind!r} is not one of {', '.join(QUANTS)}")
    tmp = out.with_name(out.name + ".partial")
    code = ("import ctypes, llama_cpp\n"
            "p = llama_cpp.llama_model_quantize_default_params()\n"
            f"p.ftype = llama_cpp.{QUANTS[kind]}\np.nthread = {threads}\n"
            f"raise SystemExit(llama_cpp.llama_model_quantize({str(src)!r}.encode(), {str(tmp)!r}.encode(), "
            "ctypes.byref(p)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise ValueError(f"llama_model_quantize {kind} of {src} failed: {child_failure(done)}")
    tmp.rename(out)
    return out


@dataclass(slots=True)
class LlamaCppSide:
    """One GGUF loaded in llama-cpp-python; greedy over the last logits (logits_all off, as llama.cpp generates).
    Sides of one file at other thread counts share the loaded model (with_threads)."""

    name: str
    llm: object
    prompt: list[int]
    decode_tokens: int
    threads: int

    @classmethod
    def load(cls, name: str, path: str | Path, prompt: list[int], decode_tokens: int, threads: int,
             context: int | None = None) -> LlamaCppSide:
        llama_cpp = require_llama_cpp()
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=context or len(prompt) + decode_tokens + 8,
                              n_threads=threads, n_threads_batch=threads, n_batch=512, n_ubatch=512,
                              logits_all=False, verbose=False)
        return cls(name, llm, prompt, decode_tokens, threads)

    def with_threads(self, name: str, threads: int, prompt: list[int] | None = None) -> LlamaCppSide:
        return LlamaCppSide(name, self.llm, self.prompt if prompt is None else prompt, self.decode_tokens, threads)

    def run(self) -> Sample:
        import numpy as np

        llm = self.llm
        llm._ctx.set_n_threads(self.threads, self.threads)
        llm.reset()
        vocab = llm.n_vocab()

        def last() -> int:
            return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))

        def feed(ids: list[int]) -> int:
            llm.eval(ids)
            return last()

        return time_generation(lambda: feed(self.prompt), lambda t: feed([t]), self.decode_tokens)
