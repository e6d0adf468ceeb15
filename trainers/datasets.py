"""Every dataset the trainers use: a synthetic one in memory and three torchvision formats.

Missing data is an error that names the directory and the files expected there
(:class:`DatasetNotFoundError`); nothing is downloaded unless asked for (``--download``),
and then only by rank 0 (see :func:`trainers.distributed.rank_zero_first`).

torchvision is imported inside the functions that need it: importing it pulls in much of
torch's compiler stack (seconds per rank), which the synthetic trainer never needs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Subset, TensorDataset

from trainers.data_files import (
    cifar10_dir,
    missing_data_message,
)


class DatasetError(RuntimeError):
    """The dataset cannot be used (corrupt, inconsistent, or its download failed)."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """The dataset's files are not where they should be."""


@dataclass(frozen=True)
class DataSplits:
    """A trainer's data: training and test sets and the number of classes."""

    train: Dataset
    test: Dataset
    num_classes: int


def first(dataset: Dataset, count: int | None) -> Dataset:
    """The first ``count`` samples of ``dataset`` (all of it for None)."""
    if count is None or count >= len(dataset):  # type: ignore[arg-type]
        return dataset
    return Subset(dataset, range(count))


# -- synthetic ----------------------------------------------------------------------------
SYNTHETIC_CLASSES = 10
SYNTHETIC_SHAPE = (1, 16, 16)
SYNTHETIC_NOISE = 1.5


def synthetic_images(
    size: int, *, seed: int, train: bool, classes: int = SYNTHETIC_CLASSES
) -> TensorDataset:
    """``size`` labelled images: one fixed smooth pattern per class plus gaussian noise.

    The class patterns depend only on ``seed``, so the training and test sets share them; the
    labels and noise come from separate streams for the two splits. A random shift of up to
    two pixels keeps the task from being solvable by a single template match.
    """
    channels, height, width = SYNTHETIC_SHAPE
    patterns_rng = torch.Generator().manual_seed(seed)
    coarse = torch.randn(classes, channels, height // 4, width // 4, generator=patterns_rng)
    patterns = F.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
    patterns = patterns / patterns.flatten(1).std(dim=1).view(-1, 1, 1, 1)

    rng = torch.Generator().manual_seed(2 * seed + (1 if train else 2) + 1_000_003)
    labels = torch.randint(classes, (size,), generator=rng)
    images = patterns[labels] + SYNTHETIC_NOISE * torch.randn(
        size, channels, height, width, generator=rng
    )
    shifts = torch.randint(-2, 3, (size, 2), generator=rng)
    for shift in shifts.unique(dim=0):
        rows = (shifts == shift).all(dim=1)
        images[rows] = images[rows].roll(shifts=tuple(shift.tolist()), dims=(2, 3))
    return TensorDataset(images, labels)


def synthetic_splits(train_size: int, test_size: int, seed: int) -> DataSplits:
    return DataSplits(
        train=synthetic_images(train_size, seed=seed, train=True),
        test=synthetic_images(test_size, seed=seed, train=False),
        num_classes=SYNTHETIC_CLASSES,
    )


# -- downloads (only when asked for) ------------------------------------------------------
def download_dataset(trainer: str, data_dir: str | os.PathLike[str]) -> None:
    """Fetch MNIST or CIFAR-10 into ``data_dir`` with torchvision, unless it is already there."""
    if missing_data_message(trainer, data_dir) is None:
        return
    from torchvision import datasets

    cls, label = {"mnist": (datasets.MNIST, "MNIST"), "cifar10": (datasets.CIFAR10, "CIFAR-10")}[
        trainer
    ]
    try:
        cls(str(data_dir), download=True)
    except Exception as exc:
        raise DatasetNotFoundError(
            f"downloading {label} into {Path(data_dir).resolve()} failed: {exc}"
        ) from exc


# -- MNIST --------------------------------------------------------------------------------
def mnist_splits(data_dir: str | os.PathLike[str]) -> DataSplits:
    """MNIST from ``data_dir/MNIST/raw`` with the usual normalisation."""
    if message := missing_data_message("mnist", data_dir):
        raise DatasetNotFoundError(message)
    from torchvision import datasets, transforms

    transform = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))]
    )
    return DataSplits(
        train=datasets.MNIST(str(data_dir), train=True, transform=transform),
        test=datasets.MNIST(str(data_dir), train=False, transform=transform),
        num_classes=10,
    )


# -- CIFAR-10 -----------------------------------------------------------------------------
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def _cifar10_class(verify: bool) -> type:
    """torchvision's CIFAR10, or (``verify=False``) one that skips the published md5 sums.

    torchvision checks each batch file with ``check_integrity(path, md5)``; with ``md5=None``
    that only tests that the file exists. Used for ``--no-verify``: re-packed or subset
    batches in the same pickle format.
    """
    from torchvision import datasets

    if verify:
        return datasets.CIFAR10

    class UnverifiedCIFAR10(datasets.CIFAR10):
        train_list = [[name, None] for name, _ in datasets.CIFAR10.train_list]
        test_list = [[name, None] for name, _ in datasets.CIFAR10.test_list]
        meta = {**datasets.CIFAR10.meta, "md5": None}

    return UnverifiedCIFAR10


def cifar10_splits(data_dir: str | os.PathLike[str], *, verify: bool = True) -> DataSplits:
    """CIFAR-10 python batches from ``data_dir/cifar-10-batches-py``, standard augmentation."""
    folder = cifar10_dir(data_dir)
    if message := missing_data_message("cifar10", data_dir):
        raise DatasetNotFoundError(message)
    from torchvision import transforms

    normalize = transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD)
    train_transform = transforms.Compose(
        [
            transforms.RandomCrop(32, padding=4),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            normalize,
        ]
    )
    test_transform = transforms.Compose([transforms.ToTensor(), normalize])
    cls = _cifar10_class(verify)
    try:
        train = cls(str(data_dir), train=True, transform=train_transform)
        test = cls(str(data_dir), train=False, transform=test_transform)
    except RuntimeError as exc:  # torchvision's "not found or corrupted": a bad md5 here
        raise DatasetError(
            f"CIFAR-10 files in {folder.resolve()} do not match the published md5 sums "
            f"(corrupt or re-packed); download them again or pass --no-verify ({exc})"
        ) from exc
    return DataSplits(train=train, test=test, num_classes=len(train.classes))


# -- image folder -------------------------------------------------------------------------
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def imagefolder_splits(data_dir: str | os.PathLike[str], *, image_size: int = 224) -> DataSplits:
    """An ImageNet-style tree ``data_dir/{train,val}/<class>/<image>``, as pytorch/examples.

    Training images get RandomResizedCrop + flip; validation images are resized to
    ``image_size * 256/224`` and centre-cropped.
    """
    root = Path(data_dir)
    if message := missing_data_message("imagefolder", data_dir):
        raise DatasetNotFoundError(message)
    from torchvision import datasets, transforms

    normalize = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    train_transform = transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            normalize,
        ]
    )
    val_transform = transforms.Compose(
        [
            transforms.Resize(round(image_size * 256 / 224)),
            transforms.CenterCrop(image_size),
            transforms.ToTensor(),
            normalize,
        ]
    )
    try:
        train = datasets.ImageFolder(str(root / "train"), transform=train_transform)
        val = datasets.ImageFolder(str(root / "val"), transform=val_transform)
    except FileNotFoundError as exc:  # no class folders, or no images in them
        raise DatasetNotFoundError(f"image folder {root.resolve()}: {exc}") from exc
    if val.classes != train.classes:
        raise DatasetError(
            f"image folder {root.resolve()}: val/ classes {val.classes} differ from "
            f"train/ classes {train.classes}"
        )
    return DataSplits(train=train, test=val, num_classes=len(train.classes))
