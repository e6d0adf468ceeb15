"""Import torch with Python's cyclic garbage collector paused, then keep what it loaded out of
the collector's sight (``gc.freeze``).

``import torch`` creates about 190,000 objects the collector tracks (functions, classes, op
overloads, dataclasses), nearly all of which live as long as the process. With the collector
on, the growing heap is scanned again and again while it loads (about 400 young, 36 middle and
4 full collections here, which found 7,500 objects of garbage between them): 0.18-0.23 s of
the 1.5 s the import takes, in every rank and in torchrun's agent. Paused, the import takes
that much less CPU, and ``gc.freeze()`` then moves what it loaded to the permanent generation:
without it the first collections after the import would scan all of it again (a full
collection of a torch process is 70-110 ms), and every later full collection would go on doing
so for the life of the process. What the import left as garbage (about 1 MiB here) stays; the
rest of the process is collected as usual.

Used where ddptui imports torch before anything of the user's has run: the rank entry and the
torchrun driver. ``gc.get_objects()`` no longer lists what was frozen; code that must see every
object calls ``gc.unfreeze()`` first (the rank's flush at exit does).
"""

from __future__ import annotations

import gc
import importlib
import sys
from types import ModuleType


def import_quietly(name: str) -> ModuleType:
    """``importlib.import_module(name)`` with the collector paused; what the process holds then
    is frozen (kept out of every later collection) once the import has succeeded. A module
    already loaded is returned as it is, and a collector the process switched off stays off."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    enabled = gc.isenabled()
    gc.disable()
    try:
        module = importlib.import_module(name)
        gc.freeze()
        return module
    finally:
        if enabled:
            gc.enable()
