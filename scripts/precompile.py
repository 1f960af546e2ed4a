"""Write the bytecode of the modules freetoken and its tests run on, by importing them once.

scripts/setup.sh installs without bytecode (uv compiles nothing; pip with --no-compile, where it would compile every
file of every package it installs: ~55 s of the set-up on a 2-core machine, most of those files never imported).
This imports what the CLI, the engine, the server and the tests load (in two processes: what imports torch, and the
rest), so their first runs find it compiled; a module left out is compiled when it is first imported, as Python
always does. Run it with bytecode writing on (setup.sh clears PYTHONDONTWRITEBYTECODE).

    python scripts/precompile.py
"""

from __future__ import annotations

import compileall
import importlib
import importlib.util
import subprocess
import sys
import time

# the model families the engine loads, as transformers names them (their configs and modeling files)
FAMILIES = ("qwen3_moe", "qwen2_moe", "qwen3_next", "qwen3_5_moe", "mixtral", "olmoe", "deepseek_v2", "deepseek_v3",
            "deepseek_v4", "gpt_oss", "glm4_moe", "glm_moe_dsa", "minimax_m2", "granitemoe", "llama")
MODULES = (
    "torch", "torch.nn.functional", "torch.utils.cpp_extension", "triton", "triton.language",
    "triton.runtime.interpreter", "numpy", "numba", "pandas", "matplotlib.pyplot", "safetensors.torch", "tokenizers",
    "transformers", "transformers.modeling_utils", "transformers.generation.utils", "transformers.models.auto",
    "hydra", "omegaconf", "rich.progress", "fastapi", "uvicorn", "httpx", "pydantic", "jsonschema", "xgrammar",
    "libcachesim", "openai", "anthropic", "pytest", "xdist", "psutil", "prometheus_client",
    "freetoken.cli", "freetoken.engine", "freetoken.serve", "freetoken.sim.run", "freetoken.placement",
    "matplotlib.backends.backend_agg", "matplotlib.backends.backend_pdf", "hydra._internal.utils",
    "hydra._internal.hydra", "hydra.core.utils", "hydra_plugins.hydra_joblib_launcher.joblib_launcher", "joblib",
    "httpcore", "anyio", "requests", "aiohttp", "execnet", "xdist.remote", "xdist.looponfail", "pyarrow.parquet",
    "triton.experimental.gluon", "openai.lib.streaming", "PIL.PngImagePlugin", "numpy.ctypeslib",
    *(f"transformers.models.{f}.modeling_{f}" for f in FAMILIES),
)
# packages whose modules run in processes they start (ray's workers and dashboard, a Hydra ray sweep's), or are
# loaded deep inside a call (fontTools by a PDF figure, pydantic.v1, uvicorn's protocols): compiled whole, when
# installed
WHOLE = ("ray", "opentelemetry", "opencensus", "google.protobuf", "grpc", "aiohttp", "aiohttp_cors", "colorful",
         "msgpack", "fontTools", "hydra", "hydra_plugins", "joblib", "pydantic", "uvicorn")

# what imports torch (the bulk: torch, transformers, triton, freetoken) is imported by the first process; the rest,
# and the packages compiled whole, by a second process beside it, on the machine's other core (importing without
# bytecode is mostly compiling source, one core's work: 37 s of a 2-core machine in one process)
TORCH_SIDE = ("torch", "triton", "transformers", "safetensors", "tokenizers", "xgrammar", "freetoken")


def torch_side(name: str) -> bool:
    return name.split(".")[0] in TORCH_SIDE


def precompile(modules=MODULES, whole=WHOLE) -> list[str]:
    """Import `modules` and compile the packages `whole` (those installed); returns the modules that did not import
    (an optional package absent, or a family this transformers lacks: compiled on first use, if ever)."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:
            missing.append(name)
    for name in whole:
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:  # a dotted name whose parent is not installed (google.protobuf without google)
            spec = None
        folders = spec.submodule_search_locations if spec is not None else None
        for folder in folders or ():
            compileall.compile_dir(folder, quiet=2, workers=0)  # (a file that fails to compile is left as it is)
    return missing


def main() -> int:
    if sys.flags.dont_write_bytecode:
        print("precompile: bytecode writing is off in this process (PYTHONDONTWRITEBYTECODE, -B); nothing written "
              "(modules are then compiled on each import)", file=sys.stderr)
        return 0
    if sys.argv[1:] == ["--beside"]:  # its module count, then what did not import
        missing = precompile(tuple(m for m in MODULES if not torch_side(m)))
        print(len(sys.modules), *missing)
        return 0
    t0 = time.perf_counter()
    beside = subprocess.Popen([sys.executable, __file__, "--beside"], stdout=subprocess.PIPE, text=True)
    missing = precompile(tuple(m for m in MODULES if torch_side(m)), ())
    last = (beside.communicate()[0].strip().splitlines() or ["0"])[-1]  # (an import may print before it)
    count, *more = last.split()
    missing += more
    note = f"; not importable here: {', '.join(missing)}" if missing else ""
    print(f"precompiled {len(sys.modules)} + {count} modules (two processes), and {', '.join(WHOLE)} whole where "
          f"installed, in {time.perf_counter() - t0:.1f} s{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
