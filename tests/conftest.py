"""Test set-up: Triton kernels run in the interpreter on CPU machines; real traces come from ../shared when present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from freetoken.defaults import usable_cores

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first `import triton`

REPO = Path(__file__).resolve().parent.parent


if "PYTEST_XDIST_WORKER" in os.environ and "torch" in globals():
    # each worker takes its share of the cores (pytest -n N runs N workers): N x all cores would oversubscribe
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, usable_cores() // _workers))


MAX_WORKERS = 4  # `-n auto`'s ceiling: each worker holds torch and the engine's kernels (~1-2 GB at its peak)


def pytest_xdist_auto_num_workers(config):
    return max(1, min(usable_cores(), MAX_WORKERS))


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu need CUDA: without it they are collected (`-m gpu` lists them) and skipped."""
    if _HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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


@pytest.fixture(scope="module")
def threads_restored():
    """A module whose runs set torch's and the host kernels' thread counts for the process puts them back after."""
    from freetoken.host import kernels as host_kernels

    before = torch.get_num_threads(), host_kernels.threads()
    yield
    torch.set_num_threads(before[0])
    host_kernels.set_threads(before[1])


# experiments: the real Hydra config composed once, shrunk per test (tiny trace, temp results dir)
@pytest.fixture(scope="session")
def anchor_cells():
    """The seed table's cells as sim.anchors predicts them (once per session: the pins and the accuracy test)."""
    from freetoken.sim import anchors

    try:
        rows = anchors.seed_rows()
    except ValueError:
        pytest.skip("anchors not present (set FT_ANCHORS or place shared/ beside the checkout)")
    return anchors.predict_cells(rows)


@pytest.fixture(scope="session")
def base_config():
    from freetoken.experiments.compose import compose

    return compose()


@pytest.fixture(scope="session")
def tiny_trace_file(tmp_path_factory) -> Path:
    """4 layers x 8 experts, top-2; 4 requests of 2 turns, each turn 10 prefill + 15 decode tokens (skewed picks)."""
    import numpy as np

    from freetoken.trace import RoutingTrace, save

    rng = np.random.default_rng(3)
    T, L, E, K = 200, 4, 8, 2
    pop = rng.dirichlet(np.full(E, 0.5), size=L)  # [L, E]
    ex = np.stack([np.stack([rng.choice(E, K, replace=False, p=pop[l]) for l in range(L)]) for _ in range(T)])
    request = np.repeat(np.arange(4, dtype=np.int32), 50)
    turn = np.tile(np.repeat(np.arange(2, dtype=np.int32), 25), 4)
    phase = np.tile(np.array([0] * 10 + [1] * 15, np.int8), 8)
    path = tmp_path_factory.mktemp("traces") / "tiny.safetensors"
    save(RoutingTrace(ex.astype(np.int16), E, model="tiny", source="test", request=request, turn=turn, phase=phase),
         path)
    return path


@pytest.fixture()
def small_config(base_config, tiny_trace_file, tmp_path):
    """base_config on the tiny trace with results under tmp_path. make("policy=belady", **{"cache.fraction": 0.5}):
    group choices as overrides (composed again), dotted keys as keyword arguments."""
    from freetoken.experiments.compose import compose, shrink

    def make(*overrides, **values):
        small = {"trace.path": str(tiny_trace_file), "trace.name": "tiny", "results.dir": str(tmp_path / "results"),
                 "results.progress": False}
        return shrink(compose(overrides) if overrides else base_config, **{**small, **values})

    return make
