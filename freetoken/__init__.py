"""freetoken: serve MoE models whose experts do not fit in GPU memory, and study where experts should live.

The simulator, the experiments and the figures are freetoken.sim, freetoken.experiments and freetoken.paper_figs.
A wheel installs them inside this package; the checkout keeps them at its top level (sim/, experiments/,
paper_figs/), which this package's search path includes, so both layouts import the same names and site-packages
gets no generic top-level package.
"""

from pathlib import Path as _Path

__version__ = "0.1.0"

_checkout = _Path(__file__).resolve().parent.parent
if (_checkout / "sim" / "__init__.py").is_file() and not (_Path(__file__).parent / "sim").is_dir():
    __path__.append(str(_checkout))  # noqa: F821  (a package's __path__): freetoken.sim -> <checkout>/sim
