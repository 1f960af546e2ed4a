"""The host side of the engine: native kernels (csrc/, built for this CPU on first use) for the MoE experts the
CPU computes, dense projections of a few rows and decode attention; the CPU lane, the cpu split and the CPU-only
engine all run through them (freetoken/host/kernels.py)."""
