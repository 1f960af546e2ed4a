"""What the server prints and reports names no user's home folder: paths under it are written with ~."""

from __future__ import annotations

from pathlib import Path


def hide_home(text: str) -> str:
    home = str(Path.home()).rstrip("/")
    return text.replace(home + "/", "~/") if home else text
