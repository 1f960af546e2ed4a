"""Where an engine runs: its device, checked, and one thread count for torch and the host kernels."""

from __future__ import annotations

import sys

import torch


def set_host_threads(threads: int | None) -> int:
    """One thread count for every kind of host work: torch's intra-op pool and the host kernels' (--threads)."""
    from freetoken.host import kernels as host_kernels

    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads <= 0):
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    n = host_kernels.set_threads(threads or torch.get_num_threads())
    torch.set_num_threads(n)
    return n


def host_kernels_built() -> bool:
    from freetoken.host import kernels as hk

    return hk.available()


def host_kernels_note(kernels: str) -> str | None:
    """One line when the host set has to run on torch (the C kernels could not be built), said once per process:
    tens of times slower, and the user should know why."""
    if kernels != "host":
        return None
    from freetoken.host import kernels as hk

    if hk.available():
        return None
    note = f"note: host kernels not built ({hk.unavailable_reason()}); the CPU path runs on torch (much slower)"
    if note not in _SAID:
        _SAID.add(note)
        print(note, file=sys.stderr, flush=True)
    return note


_SAID: set[str] = set()


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device: str | torch.device | None, name: str = "device") -> torch.device:
    """device, checked (cpu, or cuda / cuda:N where this machine has it); None: default_device(). name: how the
    caller spells the field (--device)."""
    if device is None:
        return default_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} {device!r} is not one of cpu, cuda, cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name} {device}: no CUDA device here")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"{name} {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev
