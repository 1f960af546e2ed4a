"""Lane times of one MoE call: rooflines, and PCIe DMA and the CPU lane sharing host DRAM.

Both the copy engine (host -> GPU) and the CPU expert GEMMs read the experts from the same host DRAM. `share`
is a two-flow fluid model: each flow is capped by its own lane (BP for PCIe, the CPU's demand rate for the CPU
lane); while both run, they get their caps if the caps fit in the DRAM bandwidth, otherwise the DRAM splits in
proportion to the caps; when one ends the other gets min(cap, DRAM). With DRAM = BH (full contention) hybrid
can never beat all-CPU: the two flows together never move more than BH.
"""

from __future__ import annotations

import math

import numpy as np

HOST_MODES = ("independent", "shared")


def roofline(nbytes, flops, bandwidth: float, rate: float):
    """Seconds for kernels that read nbytes at `bandwidth` B/s and do flops at `rate` FLOP/s (scalars or arrays)."""
    return np.maximum(np.divide(nbytes, bandwidth), np.divide(flops, rate))


def share(bytes_a: float, cap_a: float, bytes_b: float, cap_b: float, dram: float) -> tuple[float, float]:
    """Finish times (s) of two flows starting together on a DRAM of `dram` B/s (math.inf = independent)."""
    if bytes_a <= 0 or bytes_b <= 0:
        ta = bytes_a / min(cap_a, dram) if bytes_a > 0 else 0.0
        tb = bytes_b / min(cap_b, dram) if bytes_b > 0 else 0.0
        return ta, tb
    ra, rb = cap_a, cap_b
    if not math.isinf(dram) and ra + rb > dram:
        ra, rb = dram * ra / (ra + rb), dram * rb / (ra + rb)
    ta, tb = bytes_a / ra, bytes_b / rb
    if ta <= tb:  # a ends first; b finishes its rest alone
        return ta, ta + (bytes_b - rb * ta) / min(cap_b, dram)
    return tb + (bytes_a - ra * tb) / min(cap_a, dram), tb
