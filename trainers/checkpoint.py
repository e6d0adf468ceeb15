"""Checkpoint files on disk: the atomic write, and the temp files a killed write leaves.

A checkpoint is written to ``.NAME.PID.tmp`` beside ``NAME``, flushed to disk, then renamed
over ``NAME``, so a reader never sees half a file. A run killed during the write leaves the
temp file behind; :func:`remove_stale_temps` deletes such files at the next start, and only
those whose writer is no longer alive.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
from pathlib import Path
from typing import Any

import torch


def temp_path(path: Path, pid: int) -> Path:
    """Where process ``pid`` writes ``path`` before renaming it into place."""
    return path.with_name(f".{path.name}.{pid}.tmp")


class _NotingWriter(io.BufferedWriter):
    """A file that remembers the first OSError of a write: torch.save reports a failed write
    as ``RuntimeError: unexpected pos …``, which names neither the errno nor the file."""

    error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return super().write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise


def _write_error(exc: OSError, temp: Path) -> OSError:
    name = errno.errorcode.get(exc.errno or 0, "")
    why = (exc.strerror or str(exc)) + (f" ({name})" if name else "")
    return OSError(exc.errno, f"cannot write checkpoint: {why}", str(temp))


def save_atomic(state: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """``torch.save`` ``state`` to ``path`` atomically (temp file, fsync, ``os.replace``).
    A failed write raises OSError naming the errno (``ENOSPC``) and the temp file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = temp_path(path, os.getpid())
    try:
        file = _NotingWriter(io.FileIO(temp, "wb"))
        try:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
            file.close()
        except BaseException as exc:
            with contextlib.suppress(OSError):  # buffered bytes that cannot land either
                file.close()
            error = exc if isinstance(exc, OSError) else file.error
            if isinstance(exc, RuntimeError | OSError) and error is not None:
                raise _write_error(error, temp) from exc
            raise
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise


def remove_stale_temps(path: str | os.PathLike[str]) -> list[Path]:
    """Delete the temp files of ``path`` left by writers that are gone; returns them.

    Only names of exactly :func:`temp_path`'s form, in ``path``'s own directory, and only
    when that pid is not a live process (this process has written none yet, so its own pid
    counts as gone). A concurrent writer's file is left alone.
    """
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.([0-9]{{1,10}})\.tmp")
    removed: list[Path] = []
    try:
        entries = list(path.parent.iterdir())
    except OSError:  # no directory yet (a first run), or unreadable: nothing to clean
        return removed
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match is None or entry.is_symlink() or not entry.is_file():
            continue
        pid = int(match[1])
        if pid != os.getpid() and pid_alive(pid):
            continue
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()
            removed.append(entry)
    return removed


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (signal 0: nothing is sent)."""
    if pid <= 0:  # 0 and negatives would address process groups, not a process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except (OverflowError, OSError):
        return False
    return True
