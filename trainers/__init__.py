"""Built-in DDP trainers that ddptui can launch (``ddptui --trainer NAME``).

Each trainer is a module with ``main(argv) -> int`` that runs the one DDP loop in
:mod:`trainers.loop`; all of them also run standalone, e.g.
``torchrun --nproc-per-node 2 -m trainers.synthetic --epochs 2`` or ``python -m trainers.mnist``.
ddptui finds them through the ``ddptui.trainers`` entry points, which name the specs in
:mod:`trainers.specs`.

This package module stays free of torch imports.
"""

from ddptui.run.registry import DEFAULT_TRAINER
from trainers.specs import BUILTIN

TRAINERS: dict[str, str] = {spec.name: spec.module for spec in BUILTIN}
"""Built-in trainer name -> module path (run as ``python -m <module>``)."""

__all__ = ["DEFAULT_TRAINER", "TRAINERS"]
