"""Subclasses of torchvision's datasets, defined at module level.

A DataLoader with ``--workers N`` pickles its dataset into every worker when the worker
start method is ``spawn`` (the default inside an ``mp.spawn`` rank), and pickle finds a class
by its module and name: a class defined inside a function cannot be sent. Everything here is
importable by name, and :mod:`trainers.datasets` imports this module only when it needs it
(importing torchvision costs seconds per rank).
"""

from __future__ import annotations

from torchvision import datasets


class UnverifiedCIFAR10(datasets.CIFAR10):
    """torchvision's CIFAR10 without the published md5 sums (``--no-verify``).

    torchvision checks each batch file with ``check_integrity(path, md5)``; with ``md5=None``
    that only tests that the file exists. For re-packed or subset batches in the same pickle
    format.
    """

    train_list = [[name, None] for name, _ in datasets.CIFAR10.train_list]
    test_list = [[name, None] for name, _ in datasets.CIFAR10.test_list]
    meta = {**datasets.CIFAR10.meta, "md5": None}
