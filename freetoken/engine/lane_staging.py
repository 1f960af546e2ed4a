"""The CPU lane's activations through pinned host buffers on CUDA: x and the routing weights go down with an
asynchronous device-to-host copy (the lane waits on an event, the host thread goes on issuing GPU work), the lane's
result goes up from pinned memory (a pageable copy would block the host). One buffer per (name, shape, dtype) of a
decode step, reused call after call: a buffer is rewritten only after the lane of the next call has waited for its
own copies, which the stream orders after the previous call's upload. Without CUDA the buffers are plain host tensors
and the copies synchronous.
"""

from __future__ import annotations

import torch

from freetoken.engine.launch_count import host_buffer

STATIC_ROWS = 8  # the largest batch a decode graph is captured at (decode_graphs.BATCH_SIZES)


class LaneStaging:
    def __init__(self, pin: bool):
        self.pin = pin
        self._bufs: dict[tuple[str, tuple[int, ...], torch.dtype], torch.Tensor] = {}

    def _buf(self, name: str, shape: torch.Size, dtype: torch.dtype, tokens: int) -> torch.Tensor:
        """A decode step's buffers (tokens <= STATIC_ROWS) are kept (a captured graph copies into the same one);
        larger ones are made per call (torch's pinned-memory cache reuses a block once its copies are done), so a
        prompt length never pins a buffer for the server's life."""
        if tokens > STATIC_ROWS:
            return host_buffer(torch.empty(shape, dtype=dtype, pin_memory=self.pin))
        key = (name, tuple(shape), dtype)
        buf = self._bufs.get(key)
        if buf is None:
            buf = self._bufs[key] = host_buffer(torch.empty(shape, dtype=dtype, pin_memory=self.pin))
        return buf

    def to_host(self, name: str, t: torch.Tensor, dtype: torch.dtype, tokens: int | None = None) -> torch.Tensor:
        """t on the device (tokens: the call's, else t's rows) -> its host buffer of dtype, written by an
        asynchronous copy on CUDA: valid once the event of `ready()` has passed."""
        buf = self._buf(name, t.shape, dtype, t.shape[0] if tokens is None else tokens)
        buf.copy_(t if t.dtype == dtype else t.to(dtype), non_blocking=True)  # (on CPU as CUDA sees it: no wait)
        return buf

    def ready(self, device: torch.device) -> "torch.cuda.Event | None":
        """An event after the copies issued so far (None without CUDA: they are done)."""
        if not self.pin:
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        return event

    def put(self, name: str, h: torch.Tensor) -> torch.Tensor:
        """h on the host -> the buffer upload() reads: for a decode step the same one each call (pinned on CUDA: a
        captured graph uploads from it), else pinned per call on CUDA and h itself without."""
        if not self.pin and h.shape[0] > STATIC_ROWS:
            return h
        buf = self._buf(name, h.shape, h.dtype, h.shape[0])
        buf.copy_(h)
        return buf

    def upload(self, buf: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """put()'s buffer -> a tensor of dtype on device (from pinned memory on CUDA: no host wait)."""
        return buf.to(device, dtype, non_blocking=self.pin)

    def to_device(self, name: str, h: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """h on the host -> a tensor of dtype on device, uploaded from pinned memory on CUDA."""
        return self.upload(self.put(name, h), device, dtype)
