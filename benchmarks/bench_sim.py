"""Simulator benchmark: `ft bench sim --race-all` as a script (same arguments): the LRU race on every shipped trace
and every real routing log of the shared traces folder, besides the full benchmark on --trace.

    python benchmarks/bench_sim.py [--trace ../shared/traces/deepseek-v2-lite/deepseek_v2_lite_prefill_top6.npz]
"""

from __future__ import annotations

import sys

from freetoken.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "sim", "--race-all", *sys.argv[1:]]))
