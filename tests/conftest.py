"""Test set-up: Triton kernels run in the interpreter on CPU machines; real traces come from ../shared when present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first `import triton`

REPO = Path(__file__).resolve().parent.parent


def shared_traces_dir() -> Path | None:
    """The read-only real traces: $FT_SHARED_TRACES, or ../shared/traces beside the checkout."""
    env = os.environ.get("FT_SHARED_TRACES")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "traces", REPO / "shared" / "traces"]:
        if cand.is_dir():
            return cand
    return None


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    d = shared_traces_dir()
    if d is None:
        pytest.skip("real traces not present (set FT_SHARED_TRACES or place shared/ beside the checkout)")
    return d


def pytest_collection_modifyitems(config, items):
    if _HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
