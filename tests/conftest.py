"""Suite-wide set-up: bytecode for the code the suite's processes import, a temporary folder
of the suite's own, how many xdist workers ``-n auto`` starts, and the order in which they
get the tests.

The suite starts a few hundred Python processes (ddptui, launchers, ranks), each importing
ddptui, the trainers and test scripts. Where ``PYTHONDONTWRITEBYTECODE`` is set, none of them
writes bytecode, so each compiled those modules anew: about 40 s of a fresh clone's suite on
2 cores. The packages are compiled once here, before any worker starts (already compiled
files are skipped); torch and the other installed packages have theirs from uv
(``compile-bytecode`` in pyproject.toml).
"""

from __future__ import annotations

import compileall
import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The suite's temporary folder (the controller's stash; see :func:`_own_temp_folder`).
SUITE_TEMP = pytest.StashKey[tuple[str, dict[str, str | None]]]()


def pytest_configure(config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller did it
        return
    for folder in ("ddptui", "trainers", "tests", "benchmarks"):
        compileall.compile_dir(ROOT / folder, quiet=2, workers=1)
    _own_temp_folder(config)


def _own_temp_folder(config) -> None:
    """Every process the suite starts gets ``TMPDIR`` and ``XDG_RUNTIME_DIR`` in a folder of
    the suite's own, removed at its end: a torchrun agent or a ddptui killed with SIGKILL
    (as the fault, restart and multi-node tests kill them) cannot remove its log directory
    (``torchelastic_*``) or its trace sockets' directory, and those went into /tmp at every
    run of the suite. Short (under the temp directory, /tmp here), as a socket's path must
    be. pytest's own folders (``tmp_path``) stay where they were: this process's temp
    directory is read before the change, and the workers get theirs from it."""
    parent = tempfile.gettempdir()  # read (and kept by tempfile) before TMPDIR changes
    folder = tempfile.mkdtemp(prefix="ddptui-suite-", dir=parent)
    names = ("TMPDIR", "XDG_RUNTIME_DIR")
    config.stash[SUITE_TEMP] = (folder, {name: os.environ.get(name) for name in names})
    for name in names:
        os.environ[name] = folder


def pytest_unconfigure(config) -> None:
    folder, before = config.stash.get(SUITE_TEMP, (None, {}))
    if folder is None:
        return
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    shutil.rmtree(folder, ignore_errors=True)


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one worker more than the cores this process may run on. A worker whose
    test waits (a hang timeout, a dashboard's timers) leaves its core to the others; with one
    worker a core, that core idled (10 % of the suite's time on 2 cores, vmstat)."""
    asked = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "")
    if asked.isdigit() and int(asked) > 0:  # xdist's own override, kept
        return int(asked)
    return len(os.sched_getaffinity(0)) + 1


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """Collection with pytest's cache of rewritten test modules, even where
    ``PYTHONDONTWRITEBYTECODE`` is set: pytest rewrites every test module's asserts, and
    without its cache each worker did that anew at every run: its collection took 7.8 s, 5.0 s
    with the cache. Only the rewritten test modules are new files here (what else the tests
    import was compiled above or by uv).

    And with the garbage collector paused, as the rank entry imports torch
    (ddptui.rank.quiet_import): what collection loads lives as long as the worker and is
    frozen once it is loaded. ``pytest --collect-only -n 0`` here: 5.3-6.0 s, 4.0-4.3 s
    paused."""
    before, collecting = sys.dont_write_bytecode, gc.isenabled()
    sys.dont_write_bytecode = False
    gc.disable()  # frozen once collected (pytest_collection_finish)
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = before
        if collecting:
            gc.enable()


def pytest_collection_finish(session) -> None:
    """What collection loaded (torch, Textual, every test module) is frozen out of the garbage
    collector's sight (``gc.freeze``), as the rank entry freezes torch's import
    (ddptui.rank.quiet_import): each full collection scanned all of it again. In the unit tier
    here (timed with ``gc.callbacks``) a worker spent 6.2-8.2 s of its 30-34 s of CPU in the
    collector, 3.7-4.8 s with this. What the tests make is collected as before."""
    gc.freeze()


def pytest_collection_modifyitems(items) -> None:
    """The order in which xdist hands tests out: the slow tier first, its files taken in turn,
    with the unit tests that mostly wait (marked ``waits``) spread among them; the other unit
    tests last.

    pytest-xdist hands out tests in collection order, one at a time to the worker that is
    free. Alphabetical order left the slow dashboard runs of ``test_tui_*`` for the suite's
    last half minute, each on one worker while the other core idled; short unit tests fill
    that tail instead. But a test that waits (a dashboard's timers, a socket's timeout, a hung
    rank's hang timeout) leaves its core idle unless the other worker's test can use it: a
    real run can (its ranks are processes of their own), another unit test cannot. So the
    waiting unit tests run beside real runs, and one slow file's tests are spread out: taken
    together, the fault matrix's hang timeouts had both workers waiting at once. Every worker
    sorts alike, so their collections still match."""
    slow, waits, rest = [], [], []
    for item in items:
        if item.get_closest_marker("slow") is not None:
            slow.append(item)
        elif item.get_closest_marker("waits") is not None:
            waits.append(item)
        else:
            rest.append(item)
    items[:] = _spread(_files_in_turn(slow), waits) + rest


def _files_in_turn(items: list) -> list:
    """``items`` with their files taken in turn: each file's first test, then each one's
    second, and so on (each file's own order kept)."""
    by_file: dict[str, list] = {}
    for item in items:
        by_file.setdefault(str(item.path), []).append(item)
    queues = list(by_file.values())
    return [
        queue[i]
        for i in range(max(map(len, queues), default=0))
        for queue in queues
        if i < len(queue)
    ]


def _spread(items: list, among: list) -> list:
    """``among`` spread evenly through ``items``, both in their own order."""
    if not items:
        return among
    out, placed = [], 0
    for i, item in enumerate(items, 1):
        out.append(item)
        upto = len(among) * i // len(items)
        out.extend(among[placed:upto])
        placed = upto
    return out
