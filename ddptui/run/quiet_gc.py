"""The garbage collector of a process that applies a run's events as they come (the
dashboard, the headless mode, ``ddptui attach``): collected less often than Python's default,
and what the process holds when its first run starts frozen out of its sight.

Only ddptui's own process: the ranks are other processes, started by exec, that keep their
settings.
"""

from __future__ import annotations

import gc

#: Container allocations between two young collections of Python's cyclic garbage collector
#: in the process that ingests a run (the default is 700). See :func:`quiet_collector`.
GC_YOUNG_THRESHOLD = 10_000
_frozen = False  # this process's first run has started: what it held then is frozen


def quiet_collector() -> None:
    """Make Python's cyclic garbage collector run less often in this process.

    Ingest allocates a few objects per event (2,800 events a second at 256 ranks) and the
    dashboard's frames many more. At the default threshold the young generation was
    collected about 30 times a second and the whole heap (about 90,000 objects, most of
    them the dashboard's widgets and imported code that live as long as the process) every
    five seconds, 50-70 ms each, which stalls the screen too. Measured in ``bench_scale.py``
    (256 ranks): the collector's own time 0.60-0.72 s of a 30 s run at the default,
    0.22-0.29 s at :data:`GC_YOUNG_THRESHOLD`, and 1-2 full collections instead of 6.

    Nothing is lost: garbage without cycles is still freed at once (reference counting),
    cycles a little later. A collector switched off, or set to a higher threshold, is left
    as it is.

    The first call in a process also freezes what it holds then (``gc.freeze``): its
    imported code, and the dashboard's screens and widgets, which every full collection
    scanned again. Measured in ``bench_scale.py`` (256 ranks, the collector timed with
    ``gc.callbacks`` over the dashboard's life): full collections 0.203 s, 0.018 s frozen
    (0.47 s of collecting in all, 0.31 s). Only once: a later run's start would freeze the
    runs before it, whose reference cycles would then never be freed once they were let go,
    and a run's state grows with its length. What the first freeze holds can leak at most once
    (a widget of the start screen that is removed), and it is the process's smallest heap."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()
    young, *older = gc.get_threshold()
    if gc.isenabled() and 0 < young < GC_YOUNG_THRESHOLD:
        gc.set_threshold(GC_YOUNG_THRESHOLD, *older)
