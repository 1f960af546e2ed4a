"""The CPU lane's activations through pinned host buffers on CUDA: x and the routing weights go down with an
asynchronous device-to-host copy (the lane waits on an event, the host thread goes on issuing GPU work), the lane's
result goes up from pinned memory (a pageable copy would block the host). One buffer per (name, shape, dtype),
reused call after call: a buffer is rewritten only after the lane of the next call has waited for its own copies,
which the stream orders after the previous call's upload. Without CUDA every method is the plain `.to` it replaces.
"""

from __future__ import annotations

import torch


class LaneStaging:
    def __init__(self, pin: bool):
        self.pin = pin
        self._bufs: dict[tuple[str, tuple[int, ...], torch.dtype], torch.Tensor] = {}

    def _buf(self, name: str, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        key = (name, tuple(shape), dtype)
        buf = self._bufs.get(key)
        if buf is None:
            buf = self._bufs[key] = torch.empty(shape, dtype=dtype, pin_memory=True)
        return buf

    def to_host(self, name: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """t on the device -> a host tensor of dtype; on CUDA valid once the event of `ready()` has passed."""
        if not self.pin:
            return t.to("cpu", dtype)
        buf = self._buf(name, t.shape, dtype)
        buf.copy_(t.to(dtype), non_blocking=True)
        return buf

    def ready(self, device: torch.device) -> "torch.cuda.Event | None":
        """An event after the copies issued so far (None without CUDA: they are done)."""
        if not self.pin:
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        return event

    def to_device(self, name: str, h: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """h on the host -> a tensor of dtype on device, uploaded from pinned memory on CUDA."""
        if not self.pin:
            return h.to(device, dtype)
        buf = self._buf(name, h.shape, h.dtype)
        buf.copy_(h)
        return buf.to(device, non_blocking=True).to(dtype)
