"""What a compiled kernel's cubin says about its threads: the compile tests' check that no variant starts to spill
registers (a GPU-speed regression the interpreter and a compile-only check cannot see otherwise)."""

from __future__ import annotations

import re
import subprocess
import tempfile


def stack_bytes(cubin: bytes) -> str:
    """' stack=N': the kernel's stack frame a thread (register spills) from cuobjdump -res-usage; '' without the
    cuobjdump Triton ships."""
    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            out = subprocess.run([knobs.nvidia.cuobjdump.path, "-res-usage", f.name], capture_output=True,
                                 text=True).stdout
        except (AttributeError, OSError):
            return ""
    found = re.search(r"STACK:(\d+)", out)
    return f" stack={found.group(1)}" if found else ""


def new_spills(lines: list[str], known: dict[str, tuple[int, int]], column: int) -> tuple[dict[str, int], set[str]]:
    """From a compile script's "OK <name> stack=N" lines: ({name: bytes} of those that spill, the spilling names not
    in `known` with bytes > 0 in this arch's column)."""
    stacks = {m.group(1): int(m.group(2)) for m in (re.match(r"OK (.*) stack=(\d+)$", line) for line in lines) if m}
    spilling = {name: stack for name, stack in stacks.items() if stack > 0}
    allowed = {name for name, stacks_ in known.items() if stacks_[column] > 0}
    return spilling, set(spilling) - allowed
