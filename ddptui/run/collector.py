"""The ddptui side of telemetry: one PULL socket, validated events out.

On one node the socket is an ``ipc://`` (Unix domain) socket inside a directory that only
this user can open (mode 0700, random name, removed at close): a process of another account
cannot connect to it. ``transport="tcp"`` binds 127.0.0.1 (or ``host``) instead; a multi-node
run binds the interface other nodes reach and gives ``curve_secret`` (the run's CURVE server
key): then only peers the context's ZAP handler admits get a connection (``ddptui.run.cluster``).

Nothing a sender does can stop the collector. Every message is size-capped and decoded
against the schema; then each event is checked for plausibility (a rank outside the run's
world size, a negative or non-finite duration or rate). Malformed, oversized, foreign (another
run id) and implausible input is counted and dropped, never raised, and costs no memory
beyond the counters.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import zmq

from ddptui import protocol

#: libzmq drops a peer that sends more than this, before it reaches us (memory safety);
#: anything between MAX_MESSAGE_BYTES and this is received and counted as oversized.
_SOCKET_MAX_BYTES = 2 * protocol.MAX_MESSAGE_BYTES
#: Messages queued per connected sender before that sender has to wait. A rank sends a batch
#: at most every 50 ms, so this is seconds of backlog; it bounds what one sender can park in
#: ddptui's memory.
RECEIVE_HWM = 1_000
#: AF_UNIX socket paths must fit in 108 bytes (with the terminating NUL); stay well under.
MAX_IPC_PATH = 100
TRANSPORTS = ("ipc", "tcp")
_IPC_NAME = "c"
_IPC_PREFIX = "ddptui-"
#: A socket directory left by a ddptui that was killed is removed once it is this old (s)
#: and nothing listens on its socket.
STALE_AFTER_S = 60.0


@dataclass
class CollectorStats:
    received: int = 0
    malformed: int = 0
    foreign: int = 0
    oversized: int = 0
    implausible: int = 0  # schema-valid events with impossible values or ranks

    @property
    def rejected(self) -> int:
        return self.malformed + self.foreign + self.oversized + self.implausible


def private_ipc_dir() -> Path:
    """A new directory only this user can open (0700), for the ipc socket: under
    ``$XDG_RUNTIME_DIR`` (a per-user tmpfs) when usable, else the temp directory, else /tmp
    (whichever keeps the socket path short enough)."""
    candidates = [os.environ.get("XDG_RUNTIME_DIR"), tempfile.gettempdir(), "/tmp"]
    for base in candidates:
        if not base or not os.path.isdir(base) or not os.access(base, os.W_OK | os.X_OK):
            continue
        # mkdtemp: random name, created with mode 0700, fails rather than reuse a name.
        if len(os.path.join(base, _IPC_PREFIX + "X" * 10, _IPC_NAME).encode()) > MAX_IPC_PATH:
            continue
        remove_stale_ipc_dirs(base)
        path = Path(tempfile.mkdtemp(prefix=_IPC_PREFIX, dir=base))
        os.chmod(path, 0o700)  # whatever the umask
        return path
    raise OSError("no writable directory with a short enough path for the telemetry socket")


def stale_private_dirs(base: str, prefix: str, older_than: float) -> Iterator[str]:
    """This user's directories in ``base`` named ``prefix…``, private (0700) like the ones
    ddptui makes for its sockets, not changed for ``older_than`` seconds: candidates left
    by a ddptui that was killed (the caller checks what is inside before removing)."""
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    now, uid = time.time(), os.getuid()
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if (
            stat.S_ISDIR(info.st_mode)
            and stat.S_IMODE(info.st_mode) == 0o700
            and info.st_uid == uid
            and now - info.st_mtime >= older_than
        ):
            yield entry.path


def remove_stale_ipc_dirs(base: str) -> None:
    """Remove the socket directories of this user's ddptui processes that were killed (their
    close never ran): named and private like one, holding nothing but the socket (or
    nothing), old enough, and nothing listening on the socket."""
    for path in stale_private_dirs(base, _IPC_PREFIX, STALE_AFTER_S):
        try:
            socket_path = os.path.join(path, _IPC_NAME)
            names = os.listdir(path)
            if names == [_IPC_NAME]:
                if not stat.S_ISSOCK(os.lstat(socket_path).st_mode) or listening(socket_path):
                    continue
                os.unlink(socket_path)
            elif names:
                continue  # not what a collector leaves: not ours to remove
            os.rmdir(path)
        except OSError:
            continue


def listening(path: str) -> bool:
    """Whether a process accepts connections on the Unix socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            return False
        except OSError:
            return True  # can't tell (timeout, permission): leave it alone
    return True


class Collector:
    """PULL socket owned by ddptui. ``endpoint`` goes to the ranks as ``DDPTUI_ENDPOINT``.

    ``world_size``: events from ranks outside ``range(world_size)`` are rejected (None: any
    rank, for tests and benchmarks)."""

    def __init__(
        self,
        run_id: str,
        world_size: int | None = None,
        transport: str = "ipc",
        host: str = "127.0.0.1",
        port: int = 0,
        max_batch: int = 10_000,
        receive_hwm: int = RECEIVE_HWM,
        curve_secret: bytes | None = None,
        context: zmq.Context | None = None,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}")
        self.run_id = run_id
        self.world_size = world_size
        self.max_batch = max_batch
        self.stats = CollectorStats()
        self.ipc_dir: Path | None = None
        self._own_context = context is None
        self._context = zmq.Context() if context is None else context
        self._socket = self._context.socket(zmq.PULL)
        try:
            if curve_secret is not None:
                if transport != "tcp":
                    raise ValueError("CURVE is for the tcp transport")
                self._socket.curve_server = True
                self._socket.curve_secretkey = curve_secret
                self._socket.zap_domain = b"ddptui"
            self._socket.setsockopt(zmq.LINGER, 0)
            self._socket.setsockopt(zmq.RCVHWM, receive_hwm)
            self._socket.setsockopt(zmq.MAXMSGSIZE, _SOCKET_MAX_BYTES)
            if transport == "ipc":
                self.ipc_dir = private_ipc_dir()
                self._socket.bind(f"ipc://{self.ipc_dir / _IPC_NAME}")
            else:
                self._socket.bind(f"tcp://{host}:{port or 0}")
        except BaseException:
            self.close()
            raise
        self.endpoint: str = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._poller = zmq.Poller()
        self._poller.register(self._socket, zmq.POLLIN)

    def poll(self, timeout: float = 0.1) -> list[protocol.AnyEvent]:
        """Return what has arrived, waiting up to ``timeout`` seconds when nothing has."""
        events: list[protocol.AnyEvent] = []
        # The hot loop of ingest: names bound locally, no poll while messages are queued.
        recv, noblock, again = self._socket.recv, zmq.NOBLOCK, zmq.Again
        decode, invalid = protocol.decode_batch, protocol.InvalidEvent
        implausible, world_size = protocol.implausible, self.world_size
        limit, run_id, stats = protocol.MAX_MESSAGE_BYTES, self.run_id, self.stats
        waited = False
        for _ in range(self.max_batch):
            try:
                data = recv(noblock)
            except again:
                if waited or events or not self._poller.poll(int(timeout * 1000)):
                    break
                waited = True
                continue
            if len(data) > limit:
                stats.oversized += 1
                continue
            try:
                try:
                    batch = decode(data)
                except invalid:  # an event the schema refuses: the others still count
                    batch, bad = protocol.decode_each(data)
                    stats.malformed += bad
                for event in batch:
                    if event.run != run_id:
                        stats.foreign += 1
                        continue
                    if world_size is not None and event.rank >= world_size:
                        grown = protocol.grown_world(event, world_size)
                        if grown is not None:  # a script spawned its own ranks
                            world_size = self.world_size = grown
                    if implausible(event, world_size) is not None:
                        stats.implausible += 1
                    else:
                        events.append(event)
            except invalid:
                stats.malformed += 1
            except Exception:  # pragma: no cover - a schema-valid event no check foresaw
                stats.malformed += 1
        stats.received += len(events)
        return events

    def close(self) -> None:
        if not self._socket.closed:
            self._socket.close(linger=0)
        if self._own_context and not self._context.closed:
            self._context.term()
        if self.ipc_dir is not None:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
            self.ipc_dir = None

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
