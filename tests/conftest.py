"""Suite-wide set-up: bytecode for the code the suite's processes import, and the order in
which xdist hands tests out.

The suite starts a few hundred Python processes (ddptui, launchers, ranks), each importing
ddptui, the trainers and test scripts. Where ``PYTHONDONTWRITEBYTECODE`` is set, none of them
writes bytecode, so each compiled those modules anew: about 40 s of a fresh clone's suite on
2 cores. The packages are compiled once here, before any worker starts (already compiled
files are skipped); torch and the other installed packages have theirs from uv
(``compile-bytecode`` in pyproject.toml).
"""

from __future__ import annotations

import compileall
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller did it
        return
    for folder in ("ddptui", "trainers", "tests", "benchmarks"):
        compileall.compile_dir(ROOT / folder, quiet=2, workers=1)


def pytest_collection_modifyitems(items) -> None:
    """The slow tier first, the unit tests last (a stable sort: files keep their order).

    pytest-xdist hands out tests in collection order, so alphabetical order left the slow
    dashboard runs of ``test_tui_*`` for the suite's last half minute, each on one worker
    while the other core idled: 23 of the suite's 70 idle core-seconds. Short unit tests fill
    that tail instead. Every worker sorts alike, so their collections still match."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
