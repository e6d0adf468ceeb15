"""Where each dataset's files live, and the message when they are not there. No torch here:
ddptui's command line checks a run's data with this before it starts any process, and the
trainers raise the same message from :mod:`trainers.datasets`."""

from __future__ import annotations

import os
from pathlib import Path

MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_FILES = (
    *(f"data_batch_{i}" for i in range(1, 6)),
    "test_batch",
    "batches.meta",
)
IMAGEFOLDER_SPLITS = ("train", "val")


def mnist_raw_dir(data_dir: str | os.PathLike[str]) -> Path:
    """Where torchvision's MNIST looks for the IDX files."""
    return Path(data_dir) / "MNIST" / "raw"


def cifar10_dir(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / CIFAR10_FOLDER


def missing_files(folder: Path, names: tuple[str, ...]) -> list[str]:
    return [name for name in names if not (folder / name).is_file()]


def missing_data_message(trainer: str, data_dir: str | os.PathLike[str]) -> str | None:
    """Why ``trainer`` cannot find its dataset in ``data_dir``, or None when it can."""
    root = Path(data_dir).resolve()
    if trainer == "mnist":
        missing = missing_files(mnist_raw_dir(data_dir), MNIST_FILES)
        if missing:
            expected = ", ".join(f"MNIST/raw/{name}" for name in missing)
            return f"MNIST not found in {root} (expected {expected}); pass --download when online"
    elif trainer == "cifar10":
        missing = missing_files(cifar10_dir(data_dir), CIFAR10_FILES)
        if missing:
            expected = ", ".join(f"{CIFAR10_FOLDER}/{name}" for name in missing)
            return (
                f"CIFAR-10 not found in {root} (expected {expected}); pass --download when online"
            )
    elif trainer == "imagefolder":
        for split in IMAGEFOLDER_SPLITS:
            if not (root / split).is_dir():
                return (
                    f"image folder {root} has no {split}/ directory "
                    f"(expected {split}/<class>/<image files>)"
                )
    return None
