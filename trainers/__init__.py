"""Built-in DDP trainers that ddptui can launch (``ddptui run --trainer NAME``).

Each trainer is a module with ``main(argv) -> int`` that runs the one DDP loop in
:mod:`trainers.loop`; all of them also run standalone, e.g.
``torchrun --nproc-per-node 2 -m trainers.synthetic --epochs 2`` or ``python -m trainers.mnist``.

This package module stays free of torch imports: the CLI imports it to validate names.
"""

TRAINERS: dict[str, str] = {
    "synthetic": "trainers.synthetic",
    "mnist": "trainers.mnist",
    "cifar10": "trainers.cifar10",
    "imagefolder": "trainers.imagefolder",
}
"""Trainer name -> module path (run as ``python -m <module>``)."""

DEFAULT_TRAINER = "synthetic"

__all__ = ["DEFAULT_TRAINER", "TRAINERS"]
