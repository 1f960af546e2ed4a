"""GPU only (marker `gpu`: skipped without CUDA): the device placement kernel compiled for the GPU, not interpreted,
decides every call as the host's reference policy does, Plan by Plan (tests/kernels/test_placement_device.py runs
the same checks in Triton's interpreter on a CPU)."""

from __future__ import annotations

import pytest

from freetoken.engine.device_placement import DevicePolicy
from freetoken.sim.calls import trace_stream
from freetoken.sim.replay import replay
from tests.kernels.test_placement_device import DEVICE_POLICIES
from tests.test_compiled_policies import SPLITS, build, capacities, real, synthetic

pytestmark = pytest.mark.gpu


def check_cuda(trace, chunk, policy, options, splits) -> int:
    stream = trace_stream(trace, chunk)
    calls = list(stream.calls())
    hits = 0
    for capacity in capacities(trace, stream):
        for name in splits:
            ref = replay(calls, build(policy, options, capacity, trace, stream, True), SPLITS[name], keep_plans=True)
            dev = DevicePolicy(build(policy, options, capacity, trace, stream, False), "cuda")
            for c, (call, want) in enumerate(zip(calls, ref.plans)):
                assert dev.plan(call, SPLITS[name]) == want, f"{policy} {name} capacity {capacity} call {c}"
            hits += ref.total.hits
    return hits


@pytest.mark.parametrize("policy, options", DEVICE_POLICIES, ids=lambda x: x if isinstance(x, str) else
                         "-".join(str(v) for v in x.values()) or "-")
def test_compiled_kernel_equals_reference(policy, options):
    assert check_cuda(synthetic(0, T=40, L=4), 5, policy, options, list(SPLITS)) > 0


@pytest.mark.parametrize("name, splits", [("mixtral", ["offload", "balanced-most_tokens"]),
                                          ("granite", ["min_pairs-stream_prefill", "max2-lowest_id"])])
def test_compiled_kernel_on_real_traces(name, splits):
    trace, chunk = real(name)
    assert check_cuda(trace, chunk, "lru", {}, splits) > 0
