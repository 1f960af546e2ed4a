"""freetoken: serve MoE models whose experts do not fit in GPU memory, and study where experts should live."""

__version__ = "0.1.0"
