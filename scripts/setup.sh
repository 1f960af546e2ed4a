#!/usr/bin/env bash
# Creates .venv (if missing) and installs freetoken with its test extras. CPU machines get the CPU build of torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
# pip byte-compiles every file of every package it installs (~55 s of this script on a 2-core machine; most of those
# files are never imported): --no-compile, and what freetoken runs on is compiled below by importing it once, with
# bytecode written whatever PYTHONDONTWRITEBYTECODE says (modules imported later are compiled as Python always does)
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then pip install -q --no-compile "torch>=2.4"
  else pip install -q --no-compile torch==2.13.0; fi
fi
# the rest through uv (PyPI's uv, installed into the venv): it resolves and downloads in parallel and compiles
# nothing (this script on a fresh clone, cold caches, 2 cores: 77 s, against 124 s with pip, the same 140 packages
# at the same versions); where uv cannot be installed or fails, pip >= 25 (half the resolve time of the pip a Python
# 3.11 venv starts with). Both keep the torch above.
if ! { pip install -q --no-compile uv 2>/dev/null && uv pip install -q ${PIP_FIND_LINKS:+--find-links "$PIP_FIND_LINKS"} \
    --python .venv/bin/python -e ".[dev]"; }; then
  echo "uv unavailable or failed: installing with pip"
  pip install -q --no-compile "pip>=25" 2>/dev/null || true
  pip install -q --no-compile -e ".[dev]"
fi
export PYTHONDONTWRITEBYTECODE=
# the host kernels built now for this CPU (a C compiler's few seconds, beside the bytecode), not on the first run
# (without a C compiler the engine runs torch there and says why; not a failure of the set-up)
python -c "from freetoken.host import build; build.load() or print('host kernels:', build.unavailable_reason())" &
kernels=$!
python scripts/precompile.py  # (two processes: one per core of a 2-core machine)
wait "$kernels" || true
ft warmup --all  # compile the placement policies now (cached on disk), not in the first `ft sim` or test
echo "freetoken installed in $(pwd)/.venv"
