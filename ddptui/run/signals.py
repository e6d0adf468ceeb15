"""Signals while a run is live: Ctrl-C and SIGTERM turned into :class:`Interrupted` (the run is
torn down, ddptui exits 128 + the signal), remembered during a teardown, and held back while
processes start. Shared by ``ddptui --no-ui``, ``ddptui bench`` and ``ddptui join``."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


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
    """Hold SIGINT and SIGTERM back while processes are being started, so no signal can land
    between starting a process and remembering it; a held signal is delivered on exit."""
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
