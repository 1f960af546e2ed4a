"""Simulator benchmark: `ft bench sim` as a script (same arguments).

    python benchmarks/bench_sim.py --trace ../shared/traces/deepseek-v2-lite/deepseek_v2_lite_prefill_top6.npz
"""

from __future__ import annotations

import sys

from freetoken.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "sim", *sys.argv[1:]]))
