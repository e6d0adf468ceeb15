"""Signals while a run is live: Ctrl-C and SIGTERM turned into :class:`Interrupted` (the run is
torn down, ddptui exits 128 + the signal), remembered during a teardown, and held back while
processes start. Shared by ``ddptui --no-ui``, ``ddptui bench``, ``ddptui join`` and the session.

Held back without leaking a signal mask: blocking the signals with ``pthread_sigmask`` while a
launcher starts would do, but a child forked meanwhile inherits the blocked mask, and so would
every process under it (torchrun's agent, the ranks, the script's own workers): a script's
SIGTERM handler would never run and torchrun's SIGTERM to surviving ranks would be ignored. So
the signals are *deferred* instead: their Python handlers are swapped for one that only records
them (exec resets a caught signal to its default, so the child starts as it would without
ddptui), and a recorded signal is raised again, under the old handlers, once the start is over.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: The signals held back while processes start.
DEFERRED = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """Ctrl-C or SIGTERM reached ddptui: stop the run, exit 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SignalGuard:
    """While :attr:`armed`, SIGINT and SIGTERM raise :class:`Interrupted` (main thread only);
    disarmed, they are remembered and ignored (the run is already being torn down)."""

    def __init__(self) -> None:
        self.armed = True
        self.received: list[int] = []
        #: Whether the first SIGINT may ask for a stop with a checkpoint instead.
        self.gentle = False
        #: The first SIGINT arrived while :attr:`gentle`: the loop should ask for that stop.
        self.gentle_asked = False

    def handler(self, signum: int, frame: object) -> None:
        self.received.append(signum)
        if self.armed and self.gentle and signum == signal.SIGINT and not self.gentle_asked:
            self.gentle_asked = True  # the next Ctrl-C tears the run down as before
            return
        if self.armed:
            self.armed = False  # a second Ctrl-C during teardown must not cut it short
            raise Interrupted(signum)


@contextmanager
def signals_interrupt() -> Iterator[SignalGuard]:
    """Install a :class:`SignalGuard` for SIGINT and SIGTERM for the duration."""
    guard = SignalGuard()
    previous = {sig: signal.signal(sig, guard.handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield guard
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back for the duration; deliver the ones that came on exit.

    Only the main thread can change Python signal handlers, and only it runs them: in any
    other thread this does nothing (a signal then reaches the main thread as usual)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def record(signum: int, frame: object) -> None:
        if signum not in received:
            received.append(signum)

    previous = {sig: signal.signal(sig, record) for sig in DEFERRED}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        for sig in received:
            signal.raise_signal(sig)
