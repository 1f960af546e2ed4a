"""The GPU kernels and host syncs of a decode step, counted as the step runs (on CUDA, or on CPU as CUDA would see it).

A kernel is each torch op dispatched on a device tensor that launches one (views, `empty` and metadata ops do not),
plus each Triton launch (anything a Triton launch does inside, such as the interpreter's argument copies, is not
counted again). A host sync is each read the host waits for: `.item()` / `int()` / `bool()` on a device tensor,
`.cpu()`, `.tolist()`, `.numpy()`, a device -> host copy, `synchronize`.

On CPU the engine's device and its host are the same torch device, so a tensor is host data when it came from a
host read (`.cpu()` marks its result), from Python data (`torch.tensor(list)`), from host data only, or from code
inside `host_side()` (the CPU lane); everything else is device data, as it would be on CUDA. Ops of a worker thread
are the CPU lane's and never counted.

    counter = LaunchCounter(engine.device, engine.decoder)
    with counter.section("step"):
        logits = engine.decode(token, kv)
    with counter.section("sample"):
        token = sampler(logits[-1])
    counter.result()  # StepCount: kernels per layer, syncs per step and per token
"""

from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from freetoken import cpu_checks

_ACTIVE: list["LaunchCounter"] = []  # the counter in force (one at a time)
_NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "detach",
              "alias", "set_", "resize_", "record_stream", "is_pinned", "sym_size", "sym_stride", "sym_numel",
              "_local_scalar_dense", "is_same_size", "_has_compatible_shallow_copy_type"}
_HOST_MARK = "_ft_host"


@dataclass(slots=True)
class StepCount:
    """One decode token's device work. Layers are the decoder's (attention + MLP / MoE); `outside` is the
    embedding, the final norm, the LM head and sampling."""
    kernels: int  # all GPU kernels of the token (step + sampling)
    triton: int  # of which Triton launches
    per_layer: tuple[int, ...]  # [L] kernels of each decoder layer
    outside: int
    moe_layers: tuple[int, ...]  # decoder indices of the MoE layers
    step_syncs: int  # host syncs inside the decode step
    token_syncs: int  # host syncs of the token: the step's + sampling's
    sync_sites: dict[str, int] = field(default_factory=dict)  # "section:what" -> count
    ops: dict[str, int] = field(default_factory=dict)  # kernel name -> count

    @property
    def kernels_per_moe_layer(self) -> float:
        """Mean kernels of a MoE layer, its attention included (the budget's unit)."""
        moe = [self.per_layer[l] for l in self.moe_layers]
        return sum(moe) / len(moe) if moe else 0.0

    @staticmethod
    def keys() -> tuple[str, ...]:
        return ("decode_kernels_per_token", "decode_triton_launches", "decode_kernels_per_layer",
                "decode_kernels_outside_layers", "host_syncs_per_step", "host_syncs_per_token", "host_sync_sites")

    def to_dict(self) -> dict:
        return {"decode_kernels_per_token": self.kernels, "decode_triton_launches": self.triton,
                "decode_kernels_per_layer": round(self.kernels_per_moe_layer, 2),
                "decode_kernels_outside_layers": self.outside, "host_syncs_per_step": self.step_syncs,
                "host_syncs_per_token": self.token_syncs, "host_sync_sites": dict(self.sync_sites)}


class LaunchCounter:
    """Counts while one of its sections is open; `decoder` (optional) attributes kernels to layers through its
    `on_layer` hook."""

    def __init__(self, device: torch.device | str, decoder=None):
        self.device = torch.device(device)
        self.decoder = decoder
        self.kernels: Counter[str] = Counter()  # "layer:name" -> count
        self.syncs: Counter[str] = Counter()  # "section:what" -> count
        self.triton = 0
        self.copies = 0  # async device -> host copies
        self.layer = -1  # -1: before the first layer; L: after the last
        self.current = ""
        self._paused = 0  # inside a Triton launch or host_side()
        self._thread = 0

    # sections
    @contextmanager
    def section(self, name: str) -> Iterator["LaunchCounter"]:
        if _ACTIVE:
            raise RuntimeError("a launch count is already running")
        self.current, self.layer, self._thread = name, -1, threading.get_ident()
        _ACTIVE.append(self)
        if self.decoder is not None:
            self.decoder.on_layer = self._enter_layer
        patches = _patch()
        try:
            with _Mode(self):
                yield self
        finally:
            _unpatch(patches)
            if self.decoder is not None:
                self.decoder.on_layer = None
            _ACTIVE.remove(self)

    def _enter_layer(self, layer: int) -> None:
        self.layer = layer

    def _mine(self) -> bool:
        return threading.get_ident() == self._thread and not self._paused and not cpu_checks.depth()

    # events
    def kernel(self, name: str) -> None:
        self.kernels[f"{self.layer}:{name}"] += 1

    def sync(self, what: str) -> None:
        self.syncs[f"{self.current}:{what}"] += 1

    def is_host(self, t: torch.Tensor) -> bool:
        return getattr(t, _HOST_MARK, False) or (self.device.type != "cpu" and t.device.type == "cpu")

    def to_host(self, name: str, args, kwargs) -> bool:
        """A device -> host copy: copy_ into a host tensor, or _to_copy to the CPU from CUDA."""
        if name == "copy_":
            return self.is_host(args[0]) and not self.is_host(args[1])
        to = kwargs.get("device")
        return to is not None and torch.device(to).type == "cpu" and args[0].device.type == "cuda"

    def result(self) -> StepCount:
        layers = self.decoder.layers if self.decoder is not None else []
        L = len(layers)
        per_layer = [0] * L
        outside, ops = 0, Counter()
        for key, n in self.kernels.items():
            layer, name = key.split(":", 1)
            ops[name] += n
            if 0 <= int(layer) < L:
                per_layer[int(layer)] += n
            else:
                outside += n
        moe = tuple(l for l, lw in enumerate(layers) if getattr(lw, "router", None) is not None)
        step = sum(n for k, n in self.syncs.items() if k.startswith("step:"))
        return StepCount(sum(ops.values()), self.triton, tuple(per_layer), outside, moe, step,
                         sum(self.syncs.values()), dict(self.syncs), dict(ops))


def counting() -> bool:
    """A count is running: a CUDA graph's block runs eagerly so its kernels are seen (the same kernels)."""
    return bool(_ACTIVE)


@contextmanager
def host_side() -> Iterator[None]:
    """Host work (the CPU lane): nothing inside is a device kernel, and what it makes is host data."""
    counter = _ACTIVE[0] if _ACTIVE else None
    if counter is None or threading.get_ident() != counter._thread:
        yield
        return
    counter._paused += 1
    try:
        with _HostMarks():
            yield
    finally:
        counter._paused -= 1


def synchronize(device: torch.device) -> None:
    """The step's closing device synchronize: counted as a sync on every device (it is one on CUDA)."""
    if _ACTIVE and _ACTIVE[0]._mine():
        _ACTIVE[0].sync("synchronize")
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wait_event(event: "torch.cuda.Event | None", counted: bool) -> None:
    """The host waits for an async copy behind `event` (None: a copy on the host, done). counted: the wait may
    stall, so it is a sync, on CPU as on CUDA; otherwise a sync only where CUDA says the copy has not finished."""
    if event is not None and not event.query():
        counted = True
    if counted and _ACTIVE and _ACTIVE[0]._mine():
        _ACTIVE[0].sync("wait")
    if event is not None:
        event.synchronize()


class _Mode(TorchDispatchMode):
    def __init__(self, counter: LaunchCounter):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        c = self.counter
        if c._paused or cpu_checks.depth():
            return out
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        name = func.overloadpacket.__name__
        host = name == "lift_fresh" or (all(c.is_host(t) for t in ins) and bool(ins))  # lift_fresh: Python data
        if host:  # (a copy of host data to a CUDA device makes device data: not marked)
            _mark(out, None if c.device.type == "cpu" else "cpu")
            return out
        if name == "_local_scalar_dense":
            c.sync("item")
        elif name in ("_to_copy", "copy_") and c.to_host(name, args, kwargs or {}):
            if (kwargs or {}).get("non_blocking") or (name == "copy_" and len(args) > 2 and args[2]):
                c.copies += 1  # an async device -> host copy: the sync is whoever waits for it
            else:
                c.sync("copy to host")
        elif name not in _NO_KERNEL and not _is_view(func):
            c.kernel(name)
        return out


class _HostMarks(TorchDispatchMode):
    """Inside host_side(): every result is host data."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        _mark(out)
        return out


def host_buffer(t: torch.Tensor) -> torch.Tensor:
    """t is a host buffer (pinned on CUDA) that device data is copied into; returns t."""
    _mark(t)
    return t


def mark_host(t: torch.Tensor) -> torch.Tensor:
    """t is host data (the CPU lane's result, made on a worker thread); returns t."""
    if _ACTIVE:
        _mark(t)
    return t


def _mark(out, only: str | None = None) -> None:
    """Mark out's tensors as host data (only: those on that device type)."""
    for t in tree_leaves(out):
        if isinstance(t, torch.Tensor) and (only is None or t.device.type == only):
            try:
                setattr(t, _HOST_MARK, True)
            except (AttributeError, RuntimeError):
                pass


def _is_view(func) -> bool:
    rets = func._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


# method patches: host reads of device tensors that do not dispatch on CPU, and Triton launches
def _host_read(orig, what: str, alias: bool):
    def read(self, *args, **kwargs):
        c = _ACTIVE[0] if _ACTIVE else None
        counted = c is not None and c._mine() and self.device.type == "cpu" and c.device.type == "cpu" \
            and not c.is_host(self)
        out = orig(self, *args, **kwargs)
        if counted:
            c.sync(what)
            if alias and out is self:  # a host copy is a new tensor on CUDA: make it one here too
                c._paused += 1
                try:
                    out = self.view_as(self)
                finally:
                    c._paused -= 1
                _mark(out)
        return out

    return read


def _triton_run(orig):
    def run(self, *args, **kwargs):
        c = _ACTIVE[0] if _ACTIVE else None
        if c is None or not c._mine():
            return orig(self, *args, **kwargs)
        c.triton += 1
        fn = getattr(self, "fn", self)
        c.kernel("triton." + getattr(fn, "__name__", type(fn).__name__))
        c._paused += 1
        try:
            return orig(self, *args, **kwargs)
        finally:
            c._paused -= 1

    return run


def _patch() -> list[tuple[object, str, object]]:
    saved = []

    def put(owner, name, make):
        orig = getattr(owner, name)
        saved.append((owner, name, orig))
        setattr(owner, name, make(orig))

    put(torch.Tensor, "cpu", lambda o: _host_read(o, "cpu", True))
    put(torch.Tensor, "tolist", lambda o: _host_read(o, "tolist", False))
    put(torch.Tensor, "numpy", lambda o: _host_read(o, "numpy", False))
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:  # no Triton: the reference kernels' torch ops are what runs
        return saved
    put(InterpretedFunction, "run", _triton_run)
    put(JITFunction, "run", _triton_run)
    return saved


def _unpatch(saved: list[tuple[object, str, object]]) -> None:
    for owner, name, orig in reversed(saved):
        setattr(owner, name, orig)
