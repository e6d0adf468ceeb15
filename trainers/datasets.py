"""Every dataset the trainers use: a synthetic one in memory and three torchvision formats.

Missing data is an error that names the directory and the files expected there
(:class:`DatasetNotFoundError`); nothing is downloaded unless asked for (``--download``),
and then only by rank 0 (see :func:`trainers.distributed.rank_zero_first`).

The datasets that fit in memory (synthetic, MNIST, CIFAR-10) also come as whole tensors
(:class:`InMemory`), so that :mod:`trainers.batches` can hold them on a rank's GPU and do the
augmentation there; the torchvision datasets serve the host path (a DataLoader).

torchvision is imported inside the functions that need it: importing it pulls in much of
torch's compiler stack (seconds per rank), which the synthetic trainer never needs.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
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
class InMemory:
    """Both splits of a dataset as whole tensors, for :class:`trainers.batches.DeviceBatches`.

    ``*_images`` are ``(N, C, H, W)``: uint8 pixels, scaled to [0, 1] and normalised with
    ``mean``/``std`` per channel exactly as torchvision's ``ToTensor`` + ``Normalize`` do, or
    (``mean`` None) float images used as they are. Training batches may also get a random crop
    of the original size from the image padded with ``crop_padding`` zero pixels on every side
    and a random horizontal flip (``flip``), like torchvision's ``RandomCrop(size, padding)``
    and ``RandomHorizontalFlip``. Test batches are only normalised.
    """

    train_images: Tensor
    train_labels: Tensor
    test_images: Tensor
    test_labels: Tensor
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    crop_padding: int = 0
    flip: bool = False

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            images, labels = getattr(self, f"{split}_images"), getattr(self, f"{split}_labels")
            if images.dim() != 4 or labels.shape != images.shape[:1]:
                raise ValueError(
                    f"{split} images must be (N, C, H, W) with N labels, got "
                    f"{tuple(images.shape)} and {tuple(labels.shape)}"
                )
        if (self.mean is None) != (self.std is None):
            raise ValueError("give both mean and std, or neither")
        if self.std is not None and not all(s > 0 for s in self.std):
            raise ValueError(f"std must be positive, got {self.std}")

    @property
    def nbytes(self) -> int:
        """Bytes of the four tensors (what a rank's device has to hold)."""
        tensors = (self.train_images, self.train_labels, self.test_images, self.test_labels)
        return sum(t.numel() * t.element_size() for t in tensors)

    def first(self, train: int | None, test: int | None) -> InMemory:
        """Only the first ``train`` and ``test`` samples (all of a split for None)."""
        return dataclasses.replace(
            self,
            train_images=self.train_images[:train],
            train_labels=self.train_labels[:train],
            test_images=self.test_images[:test],
            test_labels=self.test_labels[:test],
        )


@dataclass(frozen=True)
class DataSplits:
    """A trainer's data: training and test sets and the number of classes."""

    train: Dataset
    test: Dataset
    num_classes: int
    in_memory: InMemory | None = None
    """The same samples as tensors, where the dataset fits in memory (None elsewhere)."""

    def first(self, train: int | None, test: int | None) -> DataSplits:
        """Only the first ``train`` and ``test`` samples (all of a split for None)."""
        return DataSplits(
            first(self.train, train),
            first(self.test, test),
            self.num_classes,
            None if self.in_memory is None else self.in_memory.first(train, test),
        )


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
    train = synthetic_images(train_size, seed=seed, train=True)
    test = synthetic_images(test_size, seed=seed, train=False)
    return DataSplits(
        train=train,
        test=test,
        num_classes=SYNTHETIC_CLASSES,
        in_memory=InMemory(*train.tensors, *test.tensors),
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
MNIST_MEAN = (0.1307,)
MNIST_STD = (0.3081,)


def mnist_splits(data_dir: str | os.PathLike[str]) -> DataSplits:
    """MNIST from ``data_dir/MNIST/raw`` with the usual normalisation."""
    if message := missing_data_message("mnist", data_dir):
        raise DatasetNotFoundError(message)
    from torchvision import datasets, transforms

    transform = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize(MNIST_MEAN, MNIST_STD)]
    )
    train = datasets.MNIST(str(data_dir), train=True, transform=transform)
    test = datasets.MNIST(str(data_dir), train=False, transform=transform)
    in_memory = InMemory(
        train.data.unsqueeze(1),  # (N, 28, 28) uint8 -> one channel
        train.targets.long(),
        test.data.unsqueeze(1),
        test.targets.long(),
        mean=MNIST_MEAN,
        std=MNIST_STD,
    )
    return DataSplits(train=train, test=test, num_classes=10, in_memory=in_memory)


# -- CIFAR-10 -----------------------------------------------------------------------------
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR10_CROP_PADDING = 4


def cifar10_splits(data_dir: str | os.PathLike[str], *, verify: bool = True) -> DataSplits:
    """CIFAR-10 python batches from ``data_dir/cifar-10-batches-py``, standard augmentation."""
    folder = cifar10_dir(data_dir)
    if message := missing_data_message("cifar10", data_dir):
        raise DatasetNotFoundError(message)
    from torchvision import transforms
    from torchvision.datasets import CIFAR10

    from trainers.torchvision_datasets import UnverifiedCIFAR10

    normalize = transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD)
    train_transform = transforms.Compose(
        [
            transforms.RandomCrop(32, padding=CIFAR10_CROP_PADDING),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            normalize,
        ]
    )
    test_transform = transforms.Compose([transforms.ToTensor(), normalize])
    cls = CIFAR10 if verify else UnverifiedCIFAR10
    try:
        train = cls(str(data_dir), train=True, transform=train_transform)
        test = cls(str(data_dir), train=False, transform=test_transform)
    except RuntimeError as exc:  # torchvision's "not found or corrupted": a bad md5 here
        raise DatasetError(
            f"CIFAR-10 files in {folder.resolve()} do not match the published md5 sums "
            f"(corrupt or re-packed); download them again or pass --no-verify ({exc})"
        ) from exc
    in_memory = InMemory(
        _chw(train.data),
        torch.as_tensor(train.targets, dtype=torch.long),
        _chw(test.data),
        torch.as_tensor(test.targets, dtype=torch.long),
        mean=CIFAR10_MEAN,
        std=CIFAR10_STD,
        crop_padding=CIFAR10_CROP_PADDING,
        flip=True,
    )
    return DataSplits(train=train, test=test, num_classes=len(train.classes), in_memory=in_memory)


def _chw(images_hwc: object) -> Tensor:
    """torchvision's CIFAR ``data`` (N, H, W, C uint8 numpy) as an (N, C, H, W) view."""
    return torch.from_numpy(images_hwc).permute(0, 3, 1, 2)  # type: ignore[arg-type]


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
