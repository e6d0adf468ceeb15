"""Signals while a run is live: Ctrl-C, SIGTERM and SIGHUP turned into :class:`Interrupted` (the
run is torn down, ddptui exits 128 + the signal), remembered during a teardown, and held back
while processes start. SIGHUP is the terminal going away (an ssh session dropped, a tmux server
killed): its default ended ddptui at once, with no ``summary.json``, its trace sockets' folder
left behind. It is not taken where ddptui was started to ignore it (``nohup``). Shared by
``ddptui --no-ui``, ``ddptui bench``, ``ddptui join`` and the session.

Held back without leaking a signal mask: blocking the signals with ``pthread_sigmask`` while a
launcher starts would do, but a child forked meanwhile inherits the blocked mask, and so would
every process under it (torchrun's agent, the ranks, the script's own workers): a script's
SIGTERM handler would never run and torchrun's SIGTERM to surviving ranks would be ignored. So
the signals are *deferred* instead: their Python handlers are swapped for one that only records
them (exec resets a caught signal to its default, so the child starts as it would without
ddptui), and a recorded signal is raised again, under the old handlers, once the start is over.
"""

from __future__ import annotations

import os
import signal
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: The signals held back while processes start.
DEFERRED = (signal.SIGINT, signal.SIGTERM)


def teardown_signals() -> tuple[signal.Signals, ...]:
    """The signals that tear a run down: SIGINT and SIGTERM, and SIGHUP unless ignored."""
    hangup = getattr(signal, "SIGHUP", None)
    if hangup is None or signal.getsignal(hangup) is signal.SIG_IGN:
        return DEFERRED
    return (*DEFERRED, hangup)


def quiet_lost_terminal() -> None:
    """After SIGHUP: the standard streams that were the terminal write to /dev/null, so that
    the teardown's lines (the terminal is gone: writing to it fails with EIO) do not cut it
    short. Streams to a file or a pipe stay as they are. A terminal is told by its kind, a
    character device: once hung up, ``isatty`` says it is none (its ioctl fails)."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    try:
        for fd in (0, 1, 2):
            try:
                if stat.S_ISCHR(os.fstat(fd).st_mode):
                    os.dup2(null, fd)
            except OSError:
                pass
    finally:
        os.close(null)


class Interrupted(BaseException):
    """Ctrl-C, SIGTERM or SIGHUP reached ddptui: stop the run, exit 128 + the signal's number.

    A BaseException, as KeyboardInterrupt is: the handler raises it wherever the main thread
    is, and the parts of the loop that say ddptui's own errors and go on (``except
    Exception``: applying an event, printing) took it for one of them. The signal was spent,
    the guard disarmed, and ddptui outlived its SIGTERM."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SignalGuard:
    """While :attr:`armed`, SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` (main thread
    only); disarmed, they are remembered and ignored (the run is already being torn down)."""

    def __init__(self) -> None:
        self.armed = True
        self.received: list[int] = []
        #: Whether the first SIGINT may ask for a stop with a checkpoint instead.
        self.gentle = False
        #: The first SIGINT arrived while :attr:`gentle`: the loop should ask for that stop.
        self.gentle_asked = False

    def handler(self, signum: int, frame: object) -> None:
        self.received.append(signum)
        if signum == getattr(signal, "SIGHUP", None):
            quiet_lost_terminal()
        if self.armed and self.gentle and signum == signal.SIGINT and not self.gentle_asked:
            self.gentle_asked = True  # the next Ctrl-C tears the run down as before
            return
        if self.armed:
            self.armed = False  # a second Ctrl-C during teardown must not cut it short
            raise Interrupted(signum)


@contextmanager
def signals_interrupt() -> Iterator[SignalGuard]:
    """Install a :class:`SignalGuard` for :func:`teardown_signals` for the duration."""
    guard = SignalGuard()
    previous = {sig: signal.signal(sig, guard.handler) for sig in teardown_signals()}
    try:
        yield guard
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold the teardown signals back for the duration; deliver the ones that came on exit.

    Only the main thread can change Python signal handlers, and only it runs them: in any
    other thread this does nothing (a signal then reaches the main thread as usual)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def record(signum: int, frame: object) -> None:
        if signum not in received:
            received.append(signum)

    previous = {sig: signal.signal(sig, record) for sig in teardown_signals()}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        for sig in received:
            signal.raise_signal(sig)
