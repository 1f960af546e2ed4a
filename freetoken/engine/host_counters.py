"""What the host asks of the device per run: kernel launches, host syncs and copies (the cost model's counts).

`launches` counts the Triton kernels behind each kernel-set call (KERNEL_LAUNCHES, checked against Triton's own
launches in tests/engine/test_host_counters.py); `syncs` the device-to-host reads the host waits for (routing
ids, recorded gates, the CPU lane's activations); `copies` every host <-> device transfer the engine issues
(those reads, slot-id uploads, expert weights, the CPU lane's result). sim.overhead charges the same counts.
With the device placement (engine/device_moe.py) the decision program and the expert gathers are counted as
launches (KERNEL_LAUNCHES place_call, gather_experts), the routing read is one per forward (recorder), and a
replayed MoE block graph is one launch.
Torch glue between kernels (residual adds, KV writes) is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from freetoken.engine.kernelset import KernelSet
from freetoken.kernel_launches import KERNEL_LAUNCHES


@dataclass(slots=True)
class HostCounters:
    launches: int = 0
    syncs: int = 0
    copies: int = 0

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def counted(kernels: KernelSet, counters: HostCounters) -> KernelSet:
    """The same kernel set, each call adding its launches to counters (attention by its query count)."""

    def wrap(name, fn):
        def call(*args, **kw):
            key = name if name != "attention" else ("attention_decode" if args[0].shape[0] == 1 else
                                                    "attention_prefill")
            counters.launches += KERNEL_LAUNCHES[key]
            return fn(*args, **kw)

        return call

    names = [f.name for f in fields(kernels) if f.name != "name" and getattr(kernels, f.name) is not None]
    return replace(kernels, **{n: wrap(n, getattr(kernels, n)) for n in names})
