"""Reading the files of a run directory and writing ddptui's outputs, safely.

Readers (replay, compare, export, attach, the live-runs list, ``--resume RUN_DIR``) go through
:func:`open_regular` / :func:`read_regular` / :func:`read_json`: only regular files are read (a
FIFO cannot block, a symlink to ``/dev/zero`` cannot fill memory), every read is size-capped,
and JSON is refused before parsing when it nests deeper than any file ddptui writes.

Writers (``export --csv``, bench's CSV) go through :func:`write_output`: an output never
replaces a file of a run directory; a character device or FIFO is written as a stream; a
symlink is followed to its target; anything else is written whole through a temp file and
``os.replace``, and only over a regular file or nothing.

Every failure is an :class:`OSError` (its ``strerror`` reads as one line), so callers that
already turn ``OSError`` into a one-line message need nothing more. Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

from ddptui.formatting import escaped
from ddptui.runfiles import CONFIG_FILE, EVENTS_FILE, is_run_file_name

#: Deepest JSON nesting accepted (ddptui writes at most 4 levels; users' metrics a few more).
MAX_JSON_DEPTH = 64
#: Longest path text echoed in a message.
MAX_SHOWN = 120

T = TypeVar("T")


class UnsafeFile(OSError):
    """A file ddptui refuses to read or write (not regular, too large, too deep, protected)."""

    def __init__(self, path: str | os.PathLike[str], why: str, code: int = errno.EINVAL) -> None:
        super().__init__(code, why, str(path))


def shown(path: str | os.PathLike[str] | object, limit: int = MAX_SHOWN) -> str:
    """``path`` as text for a message: one line, at most ``limit`` characters (the middle cut)."""
    text = " ".join(escaped(str(path)).split()) if str(path).strip() else repr(str(path))
    if len(text) <= limit:
        return text
    half = (limit - 1) // 2
    return f"{text[:half]}…{text[-half:]} ({len(text):,} characters)"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def path_state(path: str | os.PathLike[str]) -> os.stat_result | None:
    """``os.stat`` of ``path`` (symlinks followed), or None when nothing is there. A name too
    long, a NUL byte or a loop raise :class:`OSError` with a one-line ``strerror``."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except ValueError as exc:  # an embedded NUL byte
        raise UnsafeFile(path, f"bad path ({exc})") from None


def is_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file; False (not an exception) for any path that cannot be
    one: too long, NUL bytes, a missing directory, no permission."""
    try:
        st = path_state(path)
    except OSError:
        return False
    return st is not None and stat.S_ISREG(st.st_mode)


def is_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory; False for any path that cannot be one."""
    try:
        st = path_state(path)
    except OSError:
        return False
    return st is not None and stat.S_ISDIR(st.st_mode)


@contextlib.contextmanager
def open_regular(path: str | os.PathLike[str], max_bytes: int | None = None) -> Iterator[IO[bytes]]:
    """Open ``path`` for reading in binary, only if it is a regular file (symlinks followed)
    no larger than ``max_bytes``. Opened non-blocking, so a FIFO in its place is refused at
    once instead of waiting for a writer. Raises :class:`OSError`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except ValueError as exc:
        raise UnsafeFile(path, f"bad path ({exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(path, f"{_kind(st.st_mode)}, not a regular file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise UnsafeFile(path, f"too large ({st.st_size:,} bytes; at most {max_bytes:,})")
        os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f


def read_regular(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (see :func:`open_regular`); a
    file that grows past the cap while read is refused too."""
    with open_regular(path, max_bytes) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnsafeFile(path, f"too large (more than {max_bytes:,} bytes)")
    return data


_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def json_depth(data: bytes | str) -> int:
    """How deep the arrays and objects of a JSON text nest (strings skipped; no parsing)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    depth = deepest = 0
    for match in _JSON_TOKEN.finditer(raw):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in (b"]", b"}"):
            depth -= 1
    return deepest


def loads_bounded(data: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` that raises ValueError (not RecursionError) for JSON nested deeper than
    ``max_depth``; every caller that catches ValueError for bad JSON stays correct."""
    if json_depth(data) > max_depth:
        raise ValueError(f"JSON nested more than {max_depth} levels deep")
    try:
        return json.loads(data)
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise ValueError("JSON nested too deep") from None


def read_json(path: str | os.PathLike[str], max_bytes: int) -> Any:
    """A regular file's JSON (capped, depth-bounded). Raises OSError (unreadable, not regular,
    too large) or ValueError (not UTF-8 JSON, too deep)."""
    return loads_bounded(read_regular(path, max_bytes).decode("utf-8"))


def read_lines(
    f: IO[bytes], max_line: int, skipped: Callable[[], None] | None = None
) -> Iterator[bytes]:
    """The lines of a binary file; a line longer than ``max_line`` is skipped whole (never held
    in memory), so one enormous line cannot exhaust memory, and ``skipped`` called for it."""
    while True:
        line = f.readline(max_line + 1)
        if not line:
            return
        if len(line) > max_line and not line.endswith(b"\n"):
            while True:  # skip the rest of the over-long line
                rest = f.readline(max_line)
                if not rest or rest.endswith(b"\n"):
                    break
            if skipped is not None:
                skipped()
            continue
        yield line


# -- outputs ----------------------------------------------------------------------------------
def protected_reason(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` must not be written by an output (None when it may): it is a file of a run
    directory, or names one (the directory holds ``config.json`` or ``events.jsonl``)."""
    target = _real(path)
    parent = target.parent
    if not (is_file(parent / EVENTS_FILE) or is_file(parent / CONFIG_FILE)):
        return None
    if is_run_file_name(target.name) or os.path.lexists(target):
        return f"it is a file of the run directory {shown(parent)}"
    return None


def _real(path: str | os.PathLike[str]) -> Path:
    """``path`` with every symlink resolved (what a write would reach)."""
    try:
        return Path(os.path.realpath(path))
    except ValueError as exc:  # an embedded NUL byte
        raise UnsafeFile(path, f"bad path ({exc})") from None


def write_output(path: str | os.PathLike[str], write: Callable[[IO[str]], T]) -> T:
    """Write a text output to ``path`` with ``write(file)``; returns what ``write`` returns.

    - a file of a run directory is refused (:class:`UnsafeFile`, EEXIST);
    - a symlink is followed: its target is what gets written;
    - a character device or a FIFO is opened and written as a stream (``/dev/null`` stays a
      device; ``/dev/full`` raises ENOSPC);
    - a regular file or a new name is written whole through a temp file and ``os.replace``
      (a reader sees the old file or the new one); anything else is refused.

    Raises :class:`OSError` with a one-line ``strerror``; a failed write leaves no temp file
    behind, and the cleanup never raises a second error.
    """
    reason = protected_reason(path)
    if reason:
        raise UnsafeFile(path, f"refusing to overwrite: {reason}", errno.EEXIST)
    target = _real(path)
    st = path_state(target)
    if st is not None and (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        with open(target, "w", encoding="utf-8", newline="") as stream:
            return write(stream)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(path, f"{_kind(st.st_mode)}: not a file an output can replace")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        fd = _create_exclusive(tmp)
        with open(fd, "w", encoding="utf-8", newline="") as f:
            result = write(f)
        if st is not None:  # keep the replaced file's permissions
            with contextlib.suppress(OSError):
                os.chmod(tmp, stat.S_IMODE(st.st_mode))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return result


def _create_exclusive(tmp: Path) -> int:
    """A new temp file (never through a symlink planted at its name); one left by an earlier
    process with the same pid is removed first."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(tmp, flags, 0o644)
    except FileExistsError:
        os.unlink(tmp)  # the name itself (a symlink is removed, not followed)
        return os.open(tmp, flags, 0o644)


def why(exc: OSError) -> str:
    """An OSError as one short line: its reason and, when it names one, its file (clipped)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return f"{shown(exc.filename)}: {reason}" if exc.filename else reason


# -- appending whole lines --------------------------------------------------------------------
class LineAppender:
    """An append-only file that holds only whole lines: a write that fails part way (ENOSPC,
    EIO) is cut back off the file before the error is raised, so every line parses.

    Also tells when its file was deleted under it (:meth:`deleted`): writes into an unlinked
    file succeed and land nowhere.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        # Non-blocking open: a FIFO in its place is refused at once instead of waiting.
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        try:
            self._fd: int | None = os.open(self.path, flags, 0o644)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a FIFO nobody reads
                raise UnsafeFile(self.path, "a FIFO, not a regular file") from None
            raise
        try:
            st = os.fstat(self._fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeFile(self.path, f"{_kind(st.st_mode)}, not a regular file")
            os.set_blocking(self._fd, True)
            self.size = st.st_size
            self._identity = (st.st_dev, st.st_ino)
            self._cut_torn_tail()
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise

    def _cut_torn_tail(self) -> None:
        """A file left by a crash may end mid-line: cut it back to its last newline."""
        if self.size == 0 or self._fd is None:
            return
        with open(self.path, "rb") as f:
            start = max(0, self.size - 1024 * 1024)
            f.seek(start)
            tail = f.read()
        if tail.endswith(b"\n"):
            return
        newline = tail.rfind(b"\n")
        keep = start + newline + 1 if newline >= 0 else (0 if start == 0 else self.size)
        if keep != self.size:
            os.ftruncate(self._fd, keep)
            self.size = keep

    def append(self, data: bytes) -> None:
        """Append ``data`` (whole lines) entirely, or leave the file as it was and raise."""
        if self._fd is None:
            raise ValueError("append to a closed LineAppender")
        view = memoryview(data)
        written = 0
        try:
            while written < len(view):
                written += os.write(self._fd, view[written:])
        except BaseException:  # a full disk; or Ctrl-C's exception between two partial writes
            if written:
                with contextlib.suppress(OSError):  # the error being raised says enough
                    os.ftruncate(self._fd, self.size)
            raise
        self.size += written

    def deleted(self) -> bool:
        """Whether the file is no longer where it was opened (unlinked, or its directory
        removed or replaced)."""
        if self._fd is None:
            return False
        try:
            if os.fstat(self._fd).st_nlink == 0:
                return True
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self._identity

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
