"""A rank's heartbeat: every :data:`BEAT_S` seconds, from a thread of its own, where the main
thread is and whether it moved (runs inside every rank; stdlib only).

The main thread may be blocked in a collective (in C++, GIL released) or busy preparing data
before its first step; either way this thread reads its frames with ``sys._current_frames``
(no ptrace, no signal) and sends a ``beat`` event: the script's innermost frame, the
collective it waits in if any, a digest of the whole stack, the process's CPU seconds, the
steps so far and, when the Flight Recorder is on, the last collective started and completed
per process group. ddptui judges a hang on this evidence (a stack that has not moved while
the CPU idles), never on silence alone. It costs one frame walk a second.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ddptui.rank.frames import Frame, classify

#: Seconds between two beats.
BEAT_S = 1.0
#: The first beat comes this soon after the start (the rank's frame shows at once).
FIRST_BEAT_S = 0.5
#: Most frames of the main thread kept: the innermost, and the outermost :data:`OUTER_FRAMES`
#: of a deeper stack (the script's own frames are there: importing timm goes 274 frames deep,
#: and a beat that kept the innermost 200 read ``import torchvision``, not the script's line).
MAX_FRAMES = 200
OUTER_FRAMES = 24
#: Most frames walked (Python's own recursion limit is 1,000 by default).
WALK_FRAMES = 100_000

_collectives: Callable[[], list[dict[str, Any]]] | None = None
#: See :func:`quiet_when`.
_quiet: Callable[[], bool] | None = None
_then: Callable[[], None] | None = None
_ddp_source: Callable[[], bool] | None = None
_thread_source: Callable[[], int | None] | None = None
_evaluations_source: Callable[[], int] | None = None
_before_beat: Callable[[], None] | None = None
_beat: Heartbeat | None = None


def set_collectives_source(source: Callable[[], list[dict[str, Any]]] | None) -> None:
    """Where beats read the collectives' progress from (the Flight Recorder, when on): a
    function returning ``[{"pg", "op", "started", "completed"}, …]``; None: none."""
    global _collectives
    _collectives = source


def set_ddp_source(source: Callable[[], bool] | None) -> None:
    """Where beats learn whether the rank may hold a DDP module (:func:`ddp_possible`)."""
    global _ddp_source
    _ddp_source = source


def set_thread_source(source: Callable[[], int | None] | None) -> None:
    """Where beats learn which thread trains: a function returning the ident of the thread
    whose optimizer steps end the rank's steps (the instrumentation's), None before a step."""
    global _thread_source
    _thread_source = source


def set_evaluations_source(source: Callable[[], int] | None) -> None:
    """Where beats learn how many evaluation batches the rank has run (the hooks': see
    ``Instrument.evaluations``); None: not known (sent as 0)."""
    global _evaluations_source
    _evaluations_source = source


def set_before_beat(check: Callable[[], None] | None) -> None:
    """A check run on the heartbeat's thread before each beat (its errors are dropped): the
    local-rank watch looks again at what the script's parser read (``local_rank.settle``)."""
    global _before_beat
    _before_beat = check


def evaluations() -> Any:
    """The evaluation batches the rank has run so far, by its source (0 without one, or when
    it fails); what it says is checked where every beat's values are, in ``Reporter.beat``."""
    if _evaluations_source is None:
        return 0
    try:
        return _evaluations_source()
    except Exception:  # a beat never fails for it
        return 0


def steps_thread() -> int | None:
    """The ident of the thread that trains, when it is not the main thread (a loop run in a
    ``threading.Thread`` the main thread joins, or in an RPC thread while the main thread
    waits in ``rpc.shutdown()``: pytorch/examples' ``ddp_rpc``); None: the main thread."""
    if _thread_source is None:
        return None
    try:
        ident = _thread_source()
    except Exception:  # a beat never fails for it
        return None
    return None if ident == threading.main_thread().ident else ident


def main_frames(main_ident: int | None = None) -> list[Frame]:
    """The main thread's frames, innermost first (empty when it has none)."""
    ident = threading.main_thread().ident if main_ident is None else main_ident
    frame = sys._current_frames().get(ident)  # noqa: SLF001 - the documented way to sample
    chain = []
    while frame is not None and len(chain) < WALK_FRAMES:
        chain.append(frame)
        frame = frame.f_back
    if len(chain) > MAX_FRAMES:
        chain = chain[: MAX_FRAMES - OUTER_FRAMES] + chain[-OUTER_FRAMES:]
    return [Frame(f.f_code.co_filename, f.f_lineno or 0, f.f_code.co_name) for f in chain]


_WAKES = b"\nvoluntary_ctxt_switches:"


def thread_wakes(ident: int | None) -> int | None:
    """How many times the thread ``ident`` (a ``threading`` ident) has slept and woken: its
    voluntary context switches, from ``/proc/self/task/<tid>/status``; None where not known
    (no such thread, no ``/proc``)."""
    native = next((t.native_id for t in threading.enumerate() if t.ident == ident), None)
    if native is None:
        return None
    try:
        status = _proc(f"/proc/self/task/{native}/status")
    except OSError:
        return None
    at = status.find(_WAKES)
    if at < 0:
        return None
    value = status[at + len(_WAKES) : status.find(b"\n", at + 1)].strip()
    return int(value) if value.isdigit() else None


#: Bytes this process has read from ``/proc`` to take its own CPU and I/O counts: taken off
#: its I/O, which they would otherwise raise (a rank with 32 DataLoader workers reads about
#: 20 KB of ``/proc`` a beat).
_own_reads = 0


def _proc(path: str) -> bytes:
    """A ``/proc`` file's contents (its bytes counted in :data:`_own_reads`)."""
    global _own_reads
    with open(path, "rb") as f:
        data = f.read()
    _own_reads += len(data)
    return data


#: Most descendants of a rank looked at each beat.
MAX_DESCENDANTS = 256


def _children(pid: int) -> set[bytes]:
    """The live descendants of ``pid`` (a rank's DataLoader workers, an uploader or an
    evaluation it runs, through a shell too: ``os.system("python eval.py")``), from /proc,
    at most :data:`MAX_DESCENDANTS`; empty where they cannot be read."""
    found: set[bytes] = set()
    parents = [str(pid).encode()]
    while parents and len(found) < MAX_DESCENDANTS:
        parent = parents.pop().decode()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue  # gone
        for task in tasks:
            try:
                children = _proc(f"/proc/{parent}/task/{task}/children").split()
            except OSError:
                continue
            for child in children[: MAX_DESCENDANTS - len(found)]:
                if child not in found:
                    found.add(child)
                    parents.append(child)
    return found


def _children_cpu(pid: int, children: set[bytes] | None = None) -> float:
    """CPU seconds of the live descendants of ``pid`` (a rank's DataLoader workers: the rank
    waits for them, idle, while they work); 0.0 where it cannot be read."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return 0.0
    total = 0
    for child in _children(pid) if children is None else children:
        try:
            fields = _proc(f"/proc/{child.decode()}/stat").rsplit(b")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, ValueError, IndexError):
            continue
    return total / ticks


def process_cpu(children: set[bytes] | None = None) -> float:
    """CPU seconds this process and its live descendants have used (all threads)."""
    return time.process_time() + _children_cpu(os.getpid(), children)


#: The counters of ``/proc/<pid>/io`` that say a process moves data, summed: what its
#: ``read()`` and ``write()`` calls passed (``rchar``, ``wchar``: files, cached or not, pipes,
#: terminals, and TLS connections, whose OpenSSL socket calls are ``read`` and ``write``; not
#: a plain socket's ``send`` and ``recv``) and what it made storage read or write
#: (``read_bytes``, ``write_bytes``: also a memory-mapped file's pages).
IO_COUNTERS = (b"rchar:", b"wchar:", b"read_bytes:", b"write_bytes:")


def io_sum(data: bytes) -> int:
    """The :data:`IO_COUNTERS` of a ``/proc/<pid>/io`` file's contents, summed (ddptui's own
    sample of a rank reads them too: ``ddptui.run.probe``)."""
    total = 0
    for line in data.splitlines():
        if line.startswith(IO_COUNTERS):
            total += int(line.split()[1])
    return total


def _io(pid: int | str) -> int:
    return io_sum(_proc(f"/proc/{pid}/io"))


class _Tally:
    """Bytes moved by things that come and go (a rank's child processes, its TCP
    connections), counted by each: their total keeps what the gone ones had moved."""

    def __init__(self) -> None:
        self.last: dict[Any, int] = {}  # per one still there, its count when last read
        self.gone = 0  # what the gone ones had moved

    def reset(self) -> None:
        self.last.clear()
        self.gone = 0

    def total(self, read: dict[Any, int], there: Iterable[Any]) -> int:
        """The total, from the counts ``read`` now of the ones ``there`` (one there but
        not read keeps its last count; one no longer there keeps its last count as gone)."""
        last = self.last
        there = set(there)
        for key in [k for k in last if k not in there]:
            self.gone += last.pop(key)
        for key, count in read.items():
            last[key] = max(count, last.get(key, 0))
        return self.gone + sum(last.values())


#: The I/O of the children seen, and the last value :func:`process_io` gave (it never goes
#: back: a smaller one would read as the rank having moved).
_child_io = _Tally()
_last_io = 0


def process_io(children: set[bytes] | None = None) -> int | None:
    """Bytes this process and its descendants have moved (the :data:`IO_COUNTERS` of
    ``/proc/<pid>/io``, summed, less what this module read of ``/proc`` itself): a
    checkpoint written to a file, or streamed to an uploader through a pipe, over HTTPS to
    object storage or by a child process (``aws s3 cp``), counts; a plain socket's traffic
    does not (see :meth:`Heartbeat.socket_moved`), nor does a collective's wait. Never less
    than it gave before. None where the kernel does not count them."""
    global _last_io
    try:
        total = _io("self")
    except (OSError, ValueError, IndexError):
        return None
    live = _children(os.getpid()) if children is None else children
    read = {}
    for child in live:
        try:
            read[child] = _io(child.decode())
        except (OSError, ValueError, IndexError):
            continue  # gone, or not ours to read
    total += _child_io.total(read, live)
    _last_io = max(_last_io, total - _own_reads)
    return _last_io


#: Where ``struct tcp_info`` (linux/tcp.h) holds ``tcpi_bytes_acked`` and
#: ``tcpi_bytes_received`` (two ``__u64``, Linux 4.1 and later), and the bytes asked for.
_TCP_BYTES = struct.Struct("=QQ")
_TCP_BYTES_AT = 120
_TCP_INFO_LEN = _TCP_BYTES_AT + _TCP_BYTES.size
#: Most of this process's descriptors looked at each beat (a rank of a large gloo world
#: holds a socket per peer and process group).
MAX_FDS = 4096

#: The bytes of this process's TCP connections seen (by their sockets' inodes).
_sock_bytes = _Tally()


def _tcp_bytes(fd: int) -> int | None:
    """The bytes a TCP connection on ``fd`` has sent (acknowledged by its peer) and received;
    None for any other descriptor (a listening socket, UDP, a Unix socket), or without
    those counters. Read from a duplicate of ``fd``: the script's own is never touched."""
    try:
        copy = os.dup(fd)
    except OSError:
        return None
    try:
        sock = socket.socket(fileno=copy)
    except OSError:  # not a socket now (closed and its number reused since it was listed)
        os.close(copy)
        return None
    try:
        with sock:
            if sock.type != socket.SOCK_STREAM or sock.family not in (
                socket.AF_INET,
                socket.AF_INET6,
            ):
                return None
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except (OSError, ValueError, AttributeError):
        return None
    if len(info) < _TCP_INFO_LEN:
        return None
    sent, received = _TCP_BYTES.unpack_from(info, _TCP_BYTES_AT)
    return sent + received


def socket_bytes() -> int:
    """Bytes this process's TCP connections have moved, the closed ones' included (as last
    read): a plain socket's ``send`` and ``recv`` (an HTTP download or upload without TLS: a
    dataset fetched by rank 0 while the others wait at a barrier, a checkpoint put to
    MinIO), which ``/proc/<pid>/io`` does not count. The kernel's own counters
    (``TCP_INFO``), about 12 us a socket to read. This process's beats and a store's polls
    move well under ``diagnosis.IDLE_IO_BYTES_PER_S``; a collective's wait, nothing."""
    seen: dict[str, int] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return _sock_bytes.total({}, _sock_bytes.last)
    for name in names[:MAX_FDS]:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed since
        if not target.startswith("socket:"):
            continue
        moved = _tcp_bytes(int(name))
        if moved is not None:
            seen[target] = moved
    return _sock_bytes.total(seen, seen)


def digest(frames: list[Frame]) -> str:
    """A short digest of a stack: equal stacks, equal digests."""
    text = "\n".join(f"{f.file}:{f.line}:{f.func}" for f in frames)
    return hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=8).hexdigest()


def ddp_possible() -> bool:
    """Whether this rank may hold a DDP module, whose gradient all-reduce a ``backward()``
    waits in, by the source the rank entry set (the hooks); without one, it may."""
    if _ddp_source is None:
        return True
    try:
        return bool(_ddp_source())
    except Exception:  # a beat never fails for it
        return True


class Heartbeat:
    """The thread that sends this rank's beats through ``reporter`` until stopped."""

    def __init__(self, reporter: Any, interval: float = BEAT_S) -> None:
        self.reporter = reporter
        self.interval = interval
        self.main_ident = threading.main_thread().ident
        #: The last beat's stack digest, the TCP bytes read at it (None: not read), and the
        #: bytes moved between beats of one unmoved stack (see :meth:`socket_moved`).
        self._digest: str | None = None
        self._sockets: int | None = None
        self._socket_moved = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ddptui-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def beat(self) -> None:
        """Sample the thread that trains (the main thread, unless the steps come from another
        one that is still alive) and send one beat. The main thread's frame said where a
        loop run in a thread was: both ranks of a run whose rank 1 slept inside its training
        thread were named hung at ``t.join()``, "while no rank waits in a collective"."""
        trains = steps_thread()
        frames = main_frames(trains) if trains is not None else []
        sampled = trains
        if not frames:  # the main thread, or the one that trained has ended
            frames, sampled = main_frames(self.main_ident), self.main_ident
        ddp = ddp_possible()
        info = classify(frames, ddp=ddp)
        children = _children(os.getpid())
        stack = digest(frames) if frames else None
        io = process_io(children)
        self.reporter.beat(
            frame=info.where if frames else None,
            waiting=info.collective if info.in_collective else None,
            digest=stack,
            cpu=process_cpu(children),
            collectives=_marks(),
            io=None if io is None else io + self.socket_moved(stack),
            ddp=ddp,
            evaluations=evaluations(),
            wakes=thread_wakes(sampled),
        )

    def socket_moved(self, stack: str | None) -> int:
        """The TCP bytes (:func:`socket_bytes`) moved between consecutive beats that found the
        main thread's stack where it was: where ddptui asks whether a rank standing still
        works. Read only then (a rank of a gloo world holds a socket per peer: 1,000 of them
        take 12 ms to read), so what a training rank's connections move (its collectives'
        traffic) never counts."""
        if stack is None or stack != self._digest:
            self._digest, self._sockets = stack, None
            return self._socket_moved
        now = socket_bytes()
        if self._sockets is not None:
            self._socket_moved += max(0, now - self._sockets)
        self._sockets = now
        return self._socket_moved

    def last(self) -> None:
        """At exit: stop, and send the collectives as they ended. The beats come once a second,
        so without it each rank's column kept whatever its last beat saw: two ranks of a healthy
        run that ended showed ``#146`` and ``#184``, which reads as a desync."""
        if self._stop.is_set():  # stopped before the exit (a spawner that only waited)
            return
        self.stop()
        try:
            children = _children(os.getpid())
            io = process_io(children)
            self.reporter.beat(
                frame=None,
                waiting=None,
                digest=None,
                cpu=process_cpu(children),
                collectives=_marks(),
                io=None if io is None else io + self._socket_moved,
                evaluations=evaluations(),
            )
        except Exception:  # telemetry never takes a rank down, nor its exit
            pass

    def _run(self) -> None:
        wait = min(FIRST_BEAT_S, self.interval)
        while not self._stop.wait(wait):
            wait = self.interval
            try:
                if _quiet is not None and _quiet():
                    # Its workers (multiprocessing.Process) are the ranks now; it only waits.
                    _go_quiet(self, self.reporter)
                    return
                if _before_beat is not None:
                    try:
                        _before_beat()
                    except Exception:  # a beat never fails for it
                        pass
                self.beat()
            except Exception:  # telemetry never takes a rank down
                pass


def _marks() -> list[dict[str, Any]]:
    """The collectives source's marks (none without one, or when it fails)."""
    if _collectives is None:
        return []
    try:
        return list(_collectives() or [])
    except Exception:  # the recorder is optional; a beat never fails for it
        return []


def _go_quiet(beat: Heartbeat | None, reporter: Any) -> None:
    """Stand down: no more beats, nothing more sent, then :func:`quiet_when`'s ``then``."""
    if beat is not None:
        beat.stop()
    if _then is not None:
        _then()  # before the mute: a last word (spawned.workers_took_over)
    reporter.mute()


def quiet_at_end(reporter: Any) -> None:
    """At this process's end, before its last status: when the :func:`quiet_when` check
    holds now, the same standing down (the heartbeat stops, ``reporter`` sends
    nothing more). The heartbeat looks once a beat: workers that formed their group and
    failed within it (the tutorial's ``train_dist.py`` without its data: each worker's MNIST
    download refused at once) left the process that started them unquieted, and its
    ``finished``, sent as rank 0 at its exit, hid the failure of the worker that was rank 0."""
    if _quiet is None:
        return
    try:
        if _quiet():
            _go_quiet(_beat, reporter)
    except Exception:  # telemetry never changes how a process ends
        pass


def quiet_when(check: Callable[[], bool] | None, then: Callable[[], None] | None = None) -> None:
    """Before each beat, ``check()``: once true, the heartbeat stops, the reporter sends
    nothing more and ``then()`` runs (a process whose workers are the ranks now:
    spawned.workers_formed, spawned.stand_down)."""
    global _quiet, _then
    _quiet, _then = check, then


def last() -> None:
    """This process's last beat now (a worker that ends without exit handlers), if it beats."""
    if _beat is not None:
        _beat.last()


def _forget_after_fork() -> None:
    """A forked child (a worker the script started) has no heartbeat thread: it starts its own
    when it has a rank, and no check before its beats. Nor has it moved anything yet: its
    kernel counters start at 0, and its parent's totals, kept, hid its own I/O until it had
    moved as much."""
    global _beat, _own_reads, _last_io, _before_beat
    _beat = None
    _before_beat = None  # the parent's check, of what the parent parsed
    _own_reads = _last_io = 0
    _child_io.reset()
    _sock_bytes.reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def stop() -> None:
    """Stop this process's heartbeat, if it has one (a spawner that only waits now)."""
    if _beat is not None:
        _beat.stop()


def start(reporter: Any, interval: float = BEAT_S) -> Heartbeat | None:
    """Start this process's heartbeat (once; None when the reporter sends nowhere). It stops
    before the reporter closes at exit."""
    global _beat
    if _beat is not None or not getattr(reporter, "enabled", False):
        return _beat
    _beat = Heartbeat(reporter, interval).start()
    atexit.register(_beat.last)  # registered after the reporter's handler: runs before it
    return _beat
