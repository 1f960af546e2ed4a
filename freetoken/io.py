"""Atomic file writes: a reader sees the old file or the new one, never half of one; a failure leaves no debris."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike, new_mode: int | None = None) -> Iterator[Path]:
    """Yields a temporary path beside `path`; when the block succeeds it replaces `path`, else it is removed.

    Permissions: those of the file being replaced, else `new_mode`, else 0o666 minus the umask (mkstemp's 0600
    would make an ordinary result file private).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        mode = path.stat().st_mode & 0o777
    else:
        mode = new_mode if new_mode is not None else 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike, data: bytes | str, new_mode: int | None = None) -> Path:
    with atomic_path(path, new_mode) as tmp:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)
