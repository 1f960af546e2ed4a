"""Peak resident memory of `ft sim` against a process that only runs libCacheSim on the same key stream.

Each side runs in a fresh interpreter and reports its own ru_maxrss, so neither sees the other's allocations. The
libCacheSim side gets the keys ready-made as its oracleGeneral input file and only runs the C simulator on it
(no numpy, no freetoken imports).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

_REPORT = "import resource; print('MAXRSS_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"


def _peak_kib(code: str) -> int:
    out = subprocess.run([sys.executable, "-c", f"{code}\n{_REPORT}"], capture_output=True, text=True)
    if out.returncode != 0:
        raise ValueError(f"peak RSS probe failed: {out.stderr.strip().splitlines()[-1] if out.stderr else out.returncode}")
    line = [x for x in out.stdout.splitlines() if x.startswith("MAXRSS_KIB")][-1]
    return int(line.split()[1])


def peak_rss(trace, trace_path: str, capacity: int, prefill_chunk: int) -> dict:
    """{'ft_sim_mib', 'libcachesim_mib', 'ratio'} for an LRU run at `capacity` slots."""
    from freetoken.trace import save
    from sim.calls import trace_stream

    with tempfile.TemporaryDirectory(prefix="ft-rss-") as tmp:
        path = Path(trace_path)
        if path.suffix != ".safetensors":
            path = save(trace, Path(tmp) / "trace.safetensors")
        from freetoken.cli.bench_sim import _hashpower, write_oracle_general

        keys = Path(tmp) / "keys.oracleGeneral.bin"
        write_oracle_general(keys, trace_stream(trace, prefill_chunk).keys, with_next_access=False)
        ft = _peak_kib("from freetoken.cli import main\n"
                       f"assert main(['sim', '--trace', {str(path)!r}, '--capacity', '{capacity}', "
                       f"'--prefill-chunk', '{prefill_chunk}', '--json']) == 0")
        lcs = _peak_kib("import libcachesim as lcs\n"
                        f"reader = lcs.TraceReader({str(keys)!r}, lcs.TraceType.ORACLE_GENERAL_TRACE)\n"
                        f"lcs.LRU({capacity}, hashpower={_hashpower(capacity)}).process_trace(reader)")
    return {"ft_sim_mib": ft / 1024, "libcachesim_mib": lcs / 1024, "ratio": ft / lcs}
