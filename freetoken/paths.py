"""Where the project's shipped data lives: the checkout's conf/ and traces/ (an editable install or PYTHONPATH), or,
in an installed wheel, the same files inside the package (freetoken/_conf, freetoken/_traces)."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent  # the checkout (in a wheel: site-packages, holding no data of ours)
INSTALLED = (PACKAGE_DIR / "_conf").is_dir()  # a wheel carries its data inside the package
CONF_DIR = PACKAGE_DIR / "_conf" if INSTALLED else REPO_ROOT / "conf"
SHIPPED_TRACES = PACKAGE_DIR / "_traces" if INSTALLED else REPO_ROOT / "traces"
DEFAULT_TRACE = SHIPPED_TRACES / "synthetic-32x8-top2.safetensors"
DEMO_MODEL = PACKAGE_DIR / "demo" / "model"  # tiny random Qwen3-MoE + tokenizer (`ft demo build`)
# where results/ and ../shared are looked up: the checkout, or the folder a wheel's user runs from
WORK_ROOT = Path.cwd() if INSTALLED else REPO_ROOT


def shared_traces_dir() -> Path:
    """The read-only real routing logs: $FT_SHARED_TRACES, else ../shared/traces beside the checkout (may not exist)."""
    import os

    return Path(os.environ.get("FT_SHARED_TRACES") or WORK_ROOT.parent / "shared" / "traces")
