"""Records the routing of a live run in the spine's trace format: one row per token the model processed (with the
router hint's predictions, the trace's `hint` field, when the engine made any).

Host path: each MoE layer hands its ids and gates over on the host (`layer`). Device path (`layer_view`): the device
MoE call's union kernel writes them into a device buffer [2, T, L, K] (ids as fp32, exact below 2^24, and gates) that
`end` copies back once per forward, into pinned memory on CUDA, without waiting: the arrays are filled from it when
the next forward ends (by then the engine has read the sampled token, which waited for the copy) or when the
routing is asked for (`settle`: a wait, counted as a sync, if the copy may still be in flight). A decode step thus
holds no sync of the recorder's.
"""

from __future__ import annotations

import numpy as np
import torch

from freetoken.engine.launch_count import host_buffer, wait_event
from freetoken.trace import RoutingTrace


class TraceRecorder:
    def __init__(self, num_layers: int, top_k: int, num_experts: int, model: str):
        self.L, self.K, self.E, self.model = num_layers, top_k, num_experts, model
        self._experts: list[np.ndarray] = []  # [T, L, K] per forward
        self._gates: list[np.ndarray] = []
        self._hints: list[np.ndarray] = []  # [T, L, K] per forward, -1: no prediction
        self._drafts: list[np.ndarray] = []  # [T] per forward: 0 plain, 1 accepted draft, 2 rejected draft
        self._meta: list[tuple[np.ndarray, int, int, int]] = []  # (token ids, phase, request, turn)
        self._cur: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._device: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # T -> (device buffer, host buffer)
        self._on_device: torch.Tensor | None = None  # this forward's device buffer, once a layer wrote to it
        self._pending: tuple | None = None  # (experts, gates, host buffer, event): a copy not yet read (settle)

    def begin(self, token_ids: list[int], phase: int, request: int | list[int], turn: int | list[int]) -> None:
        """request, turn: one for the whole forward, or one per token (a batched decode step)."""
        T = len(token_ids)
        self._cur = (np.full((T, self.L, self.K), -1, np.int16), np.zeros((T, self.L, self.K), np.float16),
                     np.full((T, self.L, self.K), -1, np.int16))
        per_token = lambda v: np.broadcast_to(np.asarray(v, np.int32), (T,))  # noqa: E731
        self._meta.append((np.asarray(token_ids, np.int32), phase, per_token(request), per_token(turn)))

    def layer(self, layer: int, ids: np.ndarray, gates: np.ndarray) -> None:
        """ids, gates: [T, K] of one MoE layer of the current forward."""
        ex, g, _ = self._cur
        ex[:, layer] = ids
        g[:, layer] = gates

    def hint(self, layer: int, ids: np.ndarray) -> None:
        """ids [T, K]: the router hint's prediction of MoE layer `layer` for the current forward."""
        self._cur[2][:, layer] = ids

    def layer_view(self, layer: int, T: int, device: torch.device) -> torch.Tensor:
        """[2, T, K] fp32: where a kernel writes MoE layer `layer`'s ids and gates of this forward (device_moe's
        union kernel); the forward then reads the buffer back at its end, as after layer_device."""
        buf = self.device_buffer(T, device)
        self._on_device = buf
        return buf[:, :, layer]

    def written(self, T: int, device: torch.device) -> None:
        """A replayed graph wrote this forward's layer into the device buffer of T (its host side did not run)."""
        self._on_device = self.device_buffer(T, device)

    def device_buffer(self, T: int, device: torch.device) -> torch.Tensor:
        """The [2, T, L, K] fp32 buffer of T-token forwards on `device` (one per T, kept)."""
        bufs = self._device.get(T)
        if bufs is None or bufs[0].device != torch.device(device):
            dev = torch.zeros((2, T, self.L, self.K), dtype=torch.float32, device=device)
            host = host_buffer(torch.empty(dev.shape, dtype=torch.float32, pin_memory=dev.is_cuda))
            bufs = self._device[T] = (dev, host)
        return bufs[0]

    def end(self) -> bool:
        """Close the forward; True when its routing is copied back from the device buffer (one copy, no wait: the
        previous forward's copy is read here, after the token read between them waited for it)."""
        self._settle(counted=False)
        read = self._on_device is not None
        ex, g, h = self._cur
        if read:
            dev, host = self._device[self._on_device.shape[1]]
            host.copy_(dev, non_blocking=True)
            event = torch.cuda.Event() if dev.is_cuda else None
            if event is not None:
                event.record()
            self._pending, self._on_device = (ex, g, host, event), None
        else:
            _check_routed(ex)
        self._experts.append(ex)
        self._gates.append(g)
        self._hints.append(h)
        self._drafts.append(np.zeros(len(ex), np.int8))
        self._cur = None
        return read

    def settle(self) -> None:
        """The last forward's routing read from its copy: a wait for it, counted as a sync (it may be in flight)."""
        self._settle(counted=True)

    def _settle(self, counted: bool) -> None:
        if self._pending is None:
            return
        ex, g, host, event = self._pending
        self._pending = None
        wait_event(event, counted)
        ex[:] = host[0].numpy().astype(np.int16)
        g[:] = host[1].numpy().astype(np.float16)
        _check_routed(ex)

    def mark_draft(self, marks: list[int]) -> None:
        """The last forward was a verify step: per token 0 (the sampled token), 1 / 2 (a draft kept / rejected)."""
        if len(marks) != len(self._drafts[-1]):
            raise ValueError(f"trace recorder: {len(marks)} draft marks for a forward of {len(self._drafts[-1])}")
        self._drafts[-1] = np.asarray(marks, np.int8)

    @property
    def last_experts(self) -> np.ndarray:
        """[T, L, K] the routing of the last forward that ended."""
        self.settle()
        return self._experts[-1]

    @property
    def num_tokens(self) -> int:
        return sum(len(e) for e in self._experts)

    def trace(self, source: str = "live") -> RoutingTrace:
        if not self._experts:
            raise ValueError("no routing recorded yet")
        self.settle()
        n = [len(m[0]) for m in self._meta]
        hint, draft = np.concatenate(self._hints), np.concatenate(self._drafts)
        return RoutingTrace(
            experts=np.concatenate(self._experts), num_experts=self.E, model=self.model, source=source,
            request=np.concatenate([m[2] for m in self._meta]).astype(np.int32),
            turn=np.concatenate([m[3] for m in self._meta]).astype(np.int32),
            phase=np.repeat([m[1] for m in self._meta], n).astype(np.int8),
            token=np.concatenate([m[0] for m in self._meta]).astype(np.int32),
            gates=np.concatenate(self._gates),
            hint=hint if (hint >= 0).any() else None,  # no prediction made: a trace without the field
            draft=draft if draft.any() else None,  # no draft verified: none
        )


def _check_routed(experts: np.ndarray) -> None:
    """experts [T, L, K]: every MoE layer of the forward wrote its ids (-1 marks one that did not)."""
    if (experts < 0).any():
        raise RuntimeError("trace recorder: a forward ended before every MoE layer routed")
