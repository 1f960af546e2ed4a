"""What a compiled kernel's cubin says about its threads: the compile tests' check that no variant starts to spill
registers (a GPU-speed regression the interpreter and a compile-only check cannot see otherwise)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile


def cuobjdump() -> str | None:
    """The cuobjdump Triton ships, or None where this Triton has none (the spill check then cannot run)."""
    try:
        from triton import knobs

        path = knobs.nvidia.cuobjdump.path
    except (ImportError, AttributeError):
        return None
    return path if path and os.path.isfile(path) else None


def stack_bytes(cubin: bytes) -> str:
    """' stack=N': the kernel's stack frame a thread (register spills) from cuobjdump -res-usage; '' without
    cuobjdump."""
    tool = cuobjdump()
    if tool is None:
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"STACK:(\d+)", out)
    return f" stack={found.group(1)}" if found else ""


def new_spills(lines: list[str], known: dict[str, tuple[int, int]], column: int) -> tuple[dict[str, int], set[str]]:
    """From a compile script's "OK <name> stack=N" lines: ({name: bytes} of those that spill, the spilling names not
    in `known` with bytes > 0 in this arch's column). Where cuobjdump exists every OK line must carry its stack, so
    the check cannot pass by reading nothing."""
    compiled = [line for line in lines if line.startswith("OK ")]
    stacks = {m.group(1): int(m.group(2)) for m in (re.match(r"OK (.*) stack=(\d+)$", line) for line in compiled) if m}
    if cuobjdump() is not None:
        assert len(stacks) == len(compiled), f"no stack frame read for {len(compiled) - len(stacks)} variants"
    spilling = {name: stack for name, stack in stacks.items() if stack > 0}
    allowed = {name for name, stacks_ in known.items() if stacks_[column] > 0}
    return spilling, set(spilling) - allowed
