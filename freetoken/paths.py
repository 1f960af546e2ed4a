"""Where the project's shipped data lives (an editable install reads it from the checkout)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SHIPPED_TRACES = REPO_ROOT / "traces"
DEFAULT_TRACE = SHIPPED_TRACES / "synthetic-32x8-top2.safetensors"
CONF_DIR = REPO_ROOT / "conf"
DEMO_MODEL = REPO_ROOT / "freetoken" / "demo" / "model"  # tiny random Qwen3-MoE + tokenizer (`ft demo build`)
