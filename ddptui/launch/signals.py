"""Starting processes without losing a signal, and without leaking a signal mask into them.

While ddptui starts a launcher (and until it has remembered the new process), a Ctrl-C or a
SIGTERM must not land in between. Blocking the signals with ``pthread_sigmask`` would do
that, but a child forked meanwhile inherits the blocked mask, and so would every process
under it (torchrun's agent, the ranks, the script's own workers): a script's SIGTERM handler
would never run and torchrun's SIGTERM to surviving ranks would be ignored. So the signals
are *deferred* instead: their Python handlers are swapped for one that only records them
(exec resets a caught signal to its default, so the child starts as it would without ddptui),
and a recorded signal is raised again, under the old handlers, once the start is over.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: The signals held back while processes start.
DEFERRED = (signal.SIGINT, signal.SIGTERM)


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
