"""torch's Flight Recorder, inside a rank: recording on, traces on demand, progress per group.

torch records every collective of a process group (gloo and NCCL) into a ring buffer of
``TORCH_FR_BUFFER_SIZE`` entries: sequence number, op (``gloo:all_reduce``), input sizes and
dtypes, process group, and the Python stack that issued it. ddptui sets the size in the rank
environment (``--no-flight-recorder`` sets 0).

ddptui asks a rank for its trace while the rank's main thread may be blocked inside a C++
collective, where no Python signal handler runs. So :func:`start_trace_server` starts a daemon
thread that waits on a Unix-domain socket in a private (0700) directory ddptui created
(``DDPTUI_FR_DIR``, socket ``<rank>.sock``). A request is one line, ``dump``; the thread dumps
the recorder (a C++ call that does not need the main thread), writes ``fr-rank-N.json`` into
the run directory atomically, and answers ``ok`` (or ``error <why>``). Requests are capped,
validated and time-limited; nothing a peer sends can block the rank or end it.

:data:`progress` is the cheap part, for the rank's heartbeat: per process group the last
collective started and the last completed (torch's ``pg_status``, a few microseconds).

Light to import: nothing here imports torch; torch is used only when the script already did.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import stat
import struct
import sys
import threading
from pathlib import Path
from typing import Any

from ddptui.rank import stacks
from ddptui.runfiles import trace_name

#: torch's variable for the recorder's ring buffer (entries per backend; 0 turns it off).
BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
#: Entries ddptui asks for: torch's own default, written out so it is on whatever the default.
DEFAULT_BUFFER = 2000
#: The private directory ddptui made for the ranks' request sockets.
SOCKET_DIR_ENV = "DDPTUI_FR_DIR"
#: The request for the rank's Flight Recorder trace (``fr-rank-N.json``).
REQUEST = b"dump"
#: The request for the rank's Python stacks, appended to ``stacks-rank-N.txt`` from this
#: socket's thread (see :func:`ddptui.rank.stacks.dump_now`).
STACKS_REQUEST = b"stacks"
#: Longest request line read (anything longer is refused).
MAX_REQUEST = 64
#: How long a connection may take to send its request.
REQUEST_TIMEOUT_S = 2.0
#: Backends whose recorders are dumped (each has its own recorder instance in torch).
BACKENDS = ("gloo", "nccl")
#: Version of the fr-rank-N.json layout ddptui writes (torch's own version is inside).
TRACE_VERSION = 1

_server: TraceServer | None = None


def socket_path(directory: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` listens for trace requests."""
    return Path(directory) / f"{rank}.sock"


class _PlainUnpickler(pickle.Unpickler):
    """torch's dump is a pickle of dicts, lists, strings and numbers: refuse any class."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name} in a Flight Recorder dump")


def _loads(data: bytes) -> dict | None:
    import io

    try:
        doc = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception:
        return None
    return doc if isinstance(doc, dict) else None


def _c10d() -> Any | None:
    """torch's c10d bindings once the script has loaded them (else None). Taken from
    ``sys.modules``, never imported here: a heartbeat thread importing while the main thread
    imports torch would wait on its import lock."""
    module = sys.modules.get("torch._C._distributed_c10d")
    return module if hasattr(module, "_dump_fr_trace_json") else None


def _dump_backend(c10d: Any, backend: str) -> dict | None:
    """One backend's recorder with Python stacks, as plain data (None: nothing recorded).
    NCCL's recorder is also asked under its older name when the newer call has nothing."""
    calls = [lambda: c10d._dump_fr_trace(True, True, False, backend)]
    if backend == "nccl" and hasattr(c10d, "_dump_nccl_trace"):
        calls.append(lambda: c10d._dump_nccl_trace(True, True, False))
    for call in calls:
        try:
            doc = _loads(bytes(call()))
        except Exception:
            continue
        if doc is not None and doc.get("entries"):
            return doc
    return None


def _plain(value: Any) -> Any:
    """JSON-safe copy (bytes become text; other keys become strings)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float) and value != value:
        return None
    return value


def dump_trace(rank: int) -> dict:
    """This rank's recorded collectives from every backend that recorded any, as one document:
    ``{"ddptui_fr": 1, "rank", "version", "backends", "pg_config", "pg_status", "entries"}``
    (entries as torch writes them, ``frames`` included)."""
    c10d = _c10d()
    out: dict[str, Any] = {
        "ddptui_fr": TRACE_VERSION,
        "rank": rank,
        "pid": os.getpid(),
        "version": None,
        "backends": [],
        "pg_config": {},
        "pg_status": {},
        "entries": [],
    }
    if c10d is None:
        return out
    for backend in BACKENDS:
        doc = _dump_backend(c10d, backend)
        if doc is None:
            continue
        out["backends"].append(backend)
        out["version"] = out["version"] or doc.get("version")
        out["pg_config"].update(_plain(doc.get("pg_config") or {}))
        out["pg_status"].update(_plain(doc.get("pg_status") or {}))
        out["entries"].extend(_plain(doc.get("entries") or []))
    return out


def write_trace(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """Dump this rank's trace into ``RUN_DIR/fr-rank-N.json`` (temp file + rename)."""
    path = Path(run_dir) / trace_name(rank)
    # pid and thread: ddptui's request and the rank's own failure may write at once
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(dump_trace(rank), f, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _status(c10d: Any, backend: str) -> dict:
    """A backend's recorder without its entries (``pg_status``: a few microseconds)."""
    calls = [lambda: c10d._dump_fr_trace_json(False, True, backend)]
    if backend == "nccl" and hasattr(c10d, "_dump_nccl_trace_json"):
        calls.append(lambda: c10d._dump_nccl_trace_json(False, True))
    for call in calls:
        try:
            doc = json.loads(call())
        except Exception:
            continue
        if isinstance(doc, dict) and doc.get("pg_status"):
            return doc
    return {}


class Progress:
    """Per process group and backend, the last collective this rank started and the last that
    completed, for the rank's heartbeat: ``[{"pg", "op", "started", "completed", "backend"}, …]``.

    The sequence numbers come from torch's ``pg_status`` (a few microseconds). The op costs a
    full dump (milliseconds for 2,000 entries), so it is looked up only for a collective that
    is still the last one started at the next beat (a rank that may be stuck), once per
    collective; otherwise it is None."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}  # group -> last started, at the previous beat
        self._ops: dict[tuple[str, int], str | None] = {}  # (group, seq) -> op
        self._names: dict[str, str] = {}  # group -> its name (``default_pg``), looked up once

    def __call__(self) -> list[dict[str, Any]]:
        c10d = _c10d()
        if c10d is None:
            return []
        marks: list[dict[str, Any]] = []
        seen: dict[str, int] = {}
        for backend in BACKENDS:
            doc = _status(c10d, backend)
            for pg, status in (doc.get("pg_status") or {}).items():
                try:
                    started = int(status["last_enqueued_collective"])
                    completed = int(status["last_completed_collective"])
                except (KeyError, TypeError, ValueError):
                    continue
                if started < 0:
                    continue
                key = f"{backend}:{pg}"
                seen[key] = started
                op = self._ops.get((key, started))
                stuck = started > completed and self._seen.get(key) == started
                if key not in self._names or (stuck and op is None):
                    op, self._names[key] = self._lookup(c10d, backend, pg, started)
                    self._ops = {(key, started): op}  # only the current one is kept
                marks.append(
                    {
                        "pg": self._names[key],
                        "op": op,
                        "started": started,
                        "completed": completed if completed >= 0 else None,
                        "backend": backend,
                    }
                )
        self._seen = seen
        if not marks and (backend := _group_without_collectives()):
            # The recorder has been on since the group formed and holds nothing: no collective
            # has started in this process (a started of None; the ranks-train-apart rule).
            known = backend if backend in BACKENDS else None
            marks.append(
                {"pg": "default_pg", "op": None, "started": None, "completed": None,
                 "backend": known}
            )  # fmt: skip
        return marks

    @staticmethod
    def _lookup(c10d: Any, backend: str, pg: str, seq: int) -> tuple[str | None, str]:
        """From one dump: the op of collective ``seq`` of group ``pg`` (None when not there)
        and the group's name (its id when unnamed)."""
        try:
            doc = json.loads(c10d._dump_fr_trace_json(True, True, backend))
        except Exception:
            return None, pg
        op, name = None, pg
        for entry in reversed(doc.get("entries") or []):
            if str(entry.get("pg_id")) != pg:
                continue
            group = entry.get("process_group") or [None, None]
            name = group_label(group[0] or pg, group[1] if len(group) > 1 else None)
            if entry.get("collective_seq_id") == seq:
                profiling = str(entry.get("profiling_name", ""))
                op = profiling.rpartition(":")[2].split(" ")[0] or None
                break
        return op, name


def _group_without_collectives() -> str:
    """The default group's backend where this process has a process group and the recorder
    was switched on for it (``TORCH_FR_BUFFER_SIZE`` above 0 in its environment, as ddptui
    sets it): then an empty recorder means no collective has started here (the tutorial's
    ``train_dist.py`` on a recent torch: its gradient averaging skipped every
    ``Parameter``). "" otherwise; ``"?"`` for a backend with no name."""
    try:
        if int(os.environ.get(BUFFER_ENV, "0")) <= 0:
            return ""
    except ValueError:
        return ""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return ""
        return str(dist.get_backend()) or "?"
    except Exception:  # the progress is optional; a beat never fails for it
        return ""


def group_label(name: Any, desc: Any) -> str:
    """What a person calls a process group: its description (``default_pg``, or the
    ``group_desc`` the script gave ``new_group``), else its id (``group 1``); torch describes a
    group made without one as "undefined"."""
    if desc and str(desc) != "undefined":
        return str(desc)
    return f"group {name}"


#: The heartbeat's source of collective progress (see :class:`Progress`).
progress = Progress()


def recording() -> bool:
    """Whether torch's recorder is on in this process (``TORCH_FR_BUFFER_SIZE`` not 0)."""
    value = os.environ.get(BUFFER_ENV) or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or ""
    return value.strip() not in ("0", "-0")


def _private_dir(path: str) -> bool:
    """A directory of this user's that nobody else can enter (ddptui made it 0700)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.getuid()
        and stat.S_IMODE(info.st_mode) & 0o077 == 0
    )


def _same_user(conn: socket.socket) -> bool:
    """The peer runs as this user (the directory's mode already says so; belt and braces)."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return True
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid()


def _read_request(conn: socket.socket) -> bytes | None:
    """One request line (without the newline), or None: too long, too slow, or closed."""
    conn.settimeout(REQUEST_TIMEOUT_S)
    data = b""
    try:
        while b"\n" not in data:
            chunk = conn.recv(MAX_REQUEST + 1 - len(data))
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_REQUEST:
                return None
    except OSError:
        return None
    line, sep, _ = data.partition(b"\n")
    return line.strip() if sep else None


class TraceServer:
    """The daemon thread that answers ``dump`` (the trace) and ``stacks`` requests on
    ``<dir>/<rank>.sock``."""

    def __init__(self, directory: str, run_dir: str, rank: int) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.path = socket_path(directory, rank)
        self.path.unlink(missing_ok=True)  # a previous attempt's socket
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.bind(str(self.path))
        self.inode = os.stat(self.path).st_ino  # whose socket the path is (see close)
        self.sock.listen(4)
        self.served = 0
        self.thread = threading.Thread(target=self._serve, name="ddptui-fr", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            try:
                with conn:
                    self._answer(conn)
            except Exception:  # a peer that went away mid-answer: wait for the next one
                continue

    def _answer(self, conn: socket.socket) -> None:
        if not _same_user(conn):
            return
        request = _read_request(conn)
        if request == STACKS_REQUEST:
            conn.sendall(b"ok\n" if stacks.dump_now() else b"error no stacks file\n")
            return
        if request != REQUEST:
            conn.sendall(b"error bad request\n")
            return
        try:
            write_trace(self.run_dir, self.rank)
        except Exception as exc:
            conn.sendall(f"error {type(exc).__name__}: {exc}"[:200].encode() + b"\n")
            return
        self.served += 1
        conn.sendall(b"ok\n")

    def close(self) -> None:
        """Stop answering; the socket's path goes too, unless another process of the rank has
        bound its own there since (a worker the script started, now the rank)."""
        try:
            self.sock.close()
        finally:
            try:
                if os.stat(self.path).st_ino == self.inode:
                    self.path.unlink(missing_ok=True)
            except OSError:
                pass


#: How long the trace written on std::terminate may take before the abort goes on.
TERMINATE_DUMP_S = 5.0
#: libstdc++'s ``std::set_terminate`` (mangled): the handler a C++ thread's uncaught
#: exception ends in.
_SET_TERMINATE = "_ZSt13set_terminatePFvvE"
_VOID_FN = None  # ctypes.CFUNCTYPE(None), made on first use
_terminate_hook: Any = None  # (our handler, the previous handler, set_terminate) while on
_retired: list[Any] = []


def install_terminate_trace(run_dir: str | None, rank: int) -> bool:
    """Leave this rank's trace when a C++ thread ends the process with ``std::terminate``.

    gloo enforces a received size in its transport thread: when a peer sent more bytes than
    the collective expects (another shape or dtype, a collective left out), the exception is
    uncaught there and the process aborts (SIGABRT) without running any Python. That rank
    is usually the innocent one, and its trace is what says what it called. So a terminate
    handler writes ``fr-rank-N.json`` first (the main thread is inside the collective with
    the GIL released; at most :data:`TERMINATE_DUMP_S`), then hands over to the previous
    handler, which prints the exception and aborts as before. Only while the script runs:
    :func:`remove_terminate_trace` restores the previous handler before the interpreter
    tears down. Returns whether it was installed (libstdc++ loaded, run directory given)."""
    import ctypes

    global _VOID_FN, _terminate_hook
    if _terminate_hook is not None or not run_dir:
        return _terminate_hook is not None
    try:
        set_terminate = getattr(ctypes.CDLL(None), _SET_TERMINATE)
    except (OSError, AttributeError):
        return False  # libstdc++ not loaded (no torch), or not Linux
    _VOID_FN = _VOID_FN or ctypes.CFUNCTYPE(None)
    set_terminate.restype = ctypes.c_void_p
    set_terminate.argtypes = [ctypes.c_void_p]
    previous: list[int | None] = [None]

    def on_terminate() -> None:
        done = threading.Event()

        def dump() -> None:
            try:
                write_trace(run_dir, rank)
            except Exception:  # the abort goes on whatever happens here
                pass
            finally:
                done.set()

        threading.Thread(target=dump, name="ddptui-fr-terminate", daemon=True).start()
        done.wait(TERMINATE_DUMP_S)
        if previous[0]:
            _VOID_FN(previous[0])()  # libstdc++'s handler: prints the exception, aborts
        os.abort()

    handler = _VOID_FN(on_terminate)
    previous[0] = set_terminate(ctypes.cast(handler, ctypes.c_void_p))
    _terminate_hook = (handler, previous[0], set_terminate)
    return True


def remove_terminate_trace() -> None:
    """Put back the terminate handler :func:`install_terminate_trace` replaced."""
    global _terminate_hook
    if _terminate_hook is None:
        return
    _handler, previous, set_terminate = _terminate_hook
    set_terminate(previous)
    _retired.append(_handler)  # a terminate already under way may still be calling it
    _terminate_hook = None


def stop_trace_server() -> None:
    """This process answers for no rank any more (a spawner whose workers are the ranks)."""
    global _server
    server, _server = _server, None
    if server is not None:
        server.close()


def serve_rank(run_dir: str | None, rank: int) -> None:
    """This process is rank ``rank``: its stack file (always, with a run directory), and
    with the recorder on its trace server and terminate trace. The rank entry calls it for
    the processes ddptui starts, and a worker the script started once its process group
    names its rank. A forked worker had its parent's: they answered for the parent's rank
    (a hang among mp.spawn's workers was named from the spawner's stack, "rank 0 hung
    outside any collective, in <module>", the line of its ``mp.spawn``)."""
    if run_dir:
        stacks.register_stack_dump(run_dir, rank)
    if not recording():
        return
    if _server is not None and _server.rank != rank:
        stop_trace_server()  # it answered for the rank it had before its group said another
    start_trace_server(run_dir, rank)
    remove_terminate_trace()
    install_terminate_trace(run_dir, rank)


def _forget_server_after_fork() -> None:
    """A forked child has no thread behind its parent's trace server: it answers for nobody
    until it is a rank itself (its copy of the socket closed; the path stays the parent's)."""
    global _server
    server, _server = _server, None
    if server is not None:
        try:
            server.sock.close()
        except OSError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_server_after_fork)


def start_trace_server(run_dir: str | None, rank: int) -> TraceServer | None:
    """Answer ddptui's trace requests from a daemon thread (once per process). A no-op (None)
    without a run directory, without ``DDPTUI_FR_DIR`` or when that is not a private
    directory of this user's, and when the socket cannot be made."""
    global _server
    directory = os.environ.get(SOCKET_DIR_ENV, "")
    if _server is not None or not run_dir or not directory or not _private_dir(directory):
        return _server
    try:
        _server = TraceServer(directory, run_dir, rank)
    except OSError:
        return None
    return _server
