"""Atomic file writes: a reader sees the old file or the new one, never half of one; a failure leaves no debris."""

from __future__ import annotations

import errno
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def parent_problem(path: Path) -> str | None:
    """A file where one of path's folders should be (the nearest existing ancestor is not a folder)."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else f"{parent} is a file, not a folder"
    return None


def output_problem(path: Path) -> str | None:
    """Why `path` cannot become a file, where the file system tells before any write: it is a folder, or a file
    stands where one of its folders should be."""
    return "it is a folder; give a file name" if path.is_dir() else parent_problem(path)


def folder_problem(path: Path) -> str | None:
    """Why `path` cannot be (or become) a folder to write in: it is a file, or lies under one."""
    return "it is a file" if path.exists() and not path.is_dir() else parent_problem(path)


def cannot_write(path: Path, e: OSError) -> OSError:
    """One line naming the user's output path, never the temporary file beside it."""
    err = OSError(f"{path}: cannot write ({parent_problem(path) or e.strerror or e})")
    err.errno = e.errno
    return err


@contextmanager
def atomic_path(path: str | os.PathLike, new_mode: int | None = None) -> Iterator[Path]:
    """Yields a temporary path beside `path`; when the block succeeds it replaces `path`, else it is removed.
    Any OSError of creating, writing or renaming that file names `path`.

    Permissions: those of the file being replaced, else `new_mode`, else 0o666 minus the umask (mkstemp's 0600
    would make an ordinary result file private).
    """
    path = Path(path)
    if path.is_dir():
        raise cannot_write(path, OSError(errno.EISDIR, "it is a folder; give a file name"))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            mode = path.stat().st_mode & 0o777
        else:
            mode = new_mode if new_mode is not None else 0o666 & ~_umask()
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise cannot_write(path, e) from None
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename in (None, tmp):  # the temp file's own write or rename
            raise cannot_write(path, e) from None
        raise


def write_atomic(path: str | os.PathLike, data: bytes | str, new_mode: int | None = None) -> Path:
    with atomic_path(path, new_mode) as tmp:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)
