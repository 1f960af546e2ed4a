"""The engine keeps freed host memory for reuse: with FT_HOST_MALLOC on, a freed 16 MB temporary's memory serves the
next 8 MB one (almost no page faulted in), with it off glibc unmaps it and the next one faults every page in
(counted by getrusage's minor faults, in a fresh process for each setting: the setting is per process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHILD = r"""
import resource, torch
from freetoken.host.malloc import keep_freed_memory
print("SET", keep_freed_memory())
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.ones(4 << 20)  # 16 MB, freed at once
before = faults()
torch.ones(2 << 20)  # 8 MB: fits in the freed block (the same size would not: torch asks glibc for aligned blocks)
print("FAULTS", faults() - before)
"""


def run_child(setting: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", CHILD], env=dict(os.environ, FT_HOST_MALLOC=setting),
                         capture_output=True, text=True, check=True).stdout.split()
    return out[out.index("SET") + 1], int(out[out.index("FAULTS") + 1])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_memory_is_reused_only_when_asked():
    on, faults_on = run_child("1")
    off, faults_off = run_child("0")
    assert (on, off) == ("True", "False")
    pages = (8 << 20) // 4096
    assert faults_on < pages // 8 < pages // 2 < faults_off


def test_a_bad_setting_names_the_variable(monkeypatch):
    from freetoken.host import malloc

    monkeypatch.setenv("FT_HOST_MALLOC", "maybe")
    with pytest.raises(ValueError, match=r"^FT_HOST_MALLOC='maybe': use 1 / on"):
        malloc.wanted()
