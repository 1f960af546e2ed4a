"""Peak resident memory of `ft sim` against a process that only runs libCacheSim on the same key stream.

Each side runs in a fresh interpreter and reports its own ru_maxrss, so neither sees the other's allocations. The
libCacheSim side is what running it from Python on a key stream takes (as `libcachesim_misses`): numpy, the keys
in memory (loaded from an .npy file written here), its oracleGeneral input written from them, the C simulator run;
no freetoken import.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

# VmHWM: this process image's peak resident set (ru_maxrss would carry the parent's peak across fork + exec)
_REPORT = ("print('MAXRSS_KIB', [int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM')][0])")


def _peak_kib(code: str) -> int:
    out = subprocess.run([sys.executable, "-c", f"{code}\n{_REPORT}"], capture_output=True, text=True)
    if out.returncode != 0:
        raise ValueError(f"peak RSS probe failed: {out.stderr.strip().splitlines()[-1] if out.stderr else out.returncode}")
    line = [x for x in out.stdout.splitlines() if x.startswith("MAXRSS_KIB")][-1]
    return int(line.split()[1])


def peak_rss(trace, trace_path: str, capacity: int, prefill_chunk: int) -> dict:
    """{'ft_sim_mib', 'libcachesim_mib', 'ratio'} for an LRU run at `capacity` slots."""
    import numpy as np

    from freetoken.sim.libcachesim import hashpower
    from freetoken.trace import save
    from freetoken.sim.calls import trace_stream

    with tempfile.TemporaryDirectory(prefix="ft-rss-") as tmp:
        path = Path(trace_path)
        if path.suffix != ".safetensors":
            path = save(trace, Path(tmp) / "trace.safetensors")
        keys = Path(tmp) / "keys.npy"
        np.save(keys, trace_stream(trace, prefill_chunk).keys)
        ft = _peak_kib("from freetoken.cli import main\n"
                       f"assert main(['sim', '--trace', {str(path)!r}, '--capacity', '{capacity}', "
                       f"'--prefill-chunk', '{prefill_chunk}', '--json']) == 0")
        lcs = _peak_kib("import numpy as np, libcachesim as lcs\n"
                        f"keys = np.load({str(keys)!r})\n"
                        "rec = np.zeros(len(keys), np.dtype([('t', '<u4'), ('id', '<u8'), ('size', '<u4'), "
                        "('next', '<i8')]))\n"
                        "rec['t'] = np.arange(1, len(keys) + 1); rec['id'] = keys; rec['size'] = 1; rec['next'] = -1\n"
                        f"rec.tofile({str(keys) + '.bin'!r})\n"
                        f"reader = lcs.TraceReader({str(keys) + '.bin'!r}, lcs.TraceType.ORACLE_GENERAL_TRACE)\n"
                        f"lcs.LRU({capacity}, hashpower={hashpower(capacity)}).process_trace(reader)")
    return {"ft_sim_mib": ft / 1024, "libcachesim_mib": lcs / 1024, "ratio": ft / lcs}
