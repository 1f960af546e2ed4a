"""Server configuration: one typed record, validated once."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 1919
DEMO_MODEL_ID = "freetoken-demo"
