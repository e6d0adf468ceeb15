"""How batches reach a rank's device: one small interface, two ways behind it.

The training loop sees only :class:`Batches`: ``(inputs, targets)`` pairs already on the
rank's device (normalised, and in channels_last memory format where the model is), ``len()``
steps, and ``set_epoch(epoch)`` to reshuffle. Nothing in it waits for the device.

- :class:`LoaderBatches`, the host path: a DataLoader reads and augments samples on the CPU
  (in ``workers`` processes), pins them on CUDA, and each batch is copied to the device
  without blocking. Any dataset.
- :class:`DeviceBatches`, the device path (like airbench's CifarLoader): the whole dataset
  lives on the device as one uint8 tensor (float for synthetic data); each batch is picked
  by index, randomly cropped and flipped, and normalised there, so the GPU never waits for
  a Python worker. For datasets that come with :class:`~trainers.datasets.InMemory`.

Both take their order from the same place. Training uses a ``DistributedSampler``: one
shuffled permutation per epoch (``set_epoch`` reshuffles), padded by repeating its first
indices up to a multiple of the world size, rank ``r`` taking every ``world_size``-th index
from ``r``. Every sample is seen once per epoch over all ranks, plus those few repeats when
the dataset does not divide evenly. Evaluation uses
:func:`~trainers.distributed.shard_indices`: every test sample exactly once, no padding. So
the two paths visit the same samples in the same order; only the random numbers of the
augmentation differ.

:func:`choose_feed` picks the path (``--data-on-device auto``: the device path on CUDA when
the dataset takes at most a quarter of the GPU's free memory) and the DataLoader's workers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from ddptui.rank.cpus import threads_per_rank
from trainers.datasets import DataSplits, InMemory
from trainers.distributed import shard_indices
from trainers.options import DATA_ON_DEVICE_CHOICES

#: ``auto`` holds a dataset on the GPU only if it needs at most this share of its free memory.
DEVICE_MEMORY_SHARE = 0.25


class Batches(Protocol):
    """What the loop iterates: batches on the rank's device, ready for the model."""

    def __len__(self) -> int:
        """Batches per pass (steps per epoch)."""
        ...

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        """``(inputs, targets)`` on the device; the last batch may be smaller."""
        ...

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for ``epoch`` (training); a fixed order ignores it."""
        ...


@dataclass(frozen=True)
class Feed:
    """How this rank's batches reach its device (chosen once, by :func:`choose_feed`)."""

    device: torch.device
    batch_size: int
    on_device: bool = False
    """Hold the dataset on ``device`` (:class:`DeviceBatches`) instead of a DataLoader."""
    workers: int = 0
    """DataLoader worker processes (host path only)."""
    channels_last: bool = False
    """Hand inputs over in channels_last memory format (convolutions on CUDA)."""

    def describe(self) -> str:
        """One line for the log: which path, and how."""
        layout = ", channels_last" if self.channels_last else ""
        if self.on_device:
            return f"held on {self.device}, batches prepared there{layout}"
        pinned = ", pinned" if self.device.type == "cuda" else ""
        workers = f"{self.workers} worker{'' if self.workers == 1 else 's'}"
        return f"DataLoader, {workers}{pinned}{layout}"


def choose_feed(
    data: DataSplits,
    device: torch.device,
    *,
    batch_size: int,
    data_on_device: str = "auto",
    workers: int | None = None,
    local_world_size: int = 1,
    channels_last: bool = False,
) -> Feed:
    """The feed for ``--data-on-device`` and ``--workers`` (None: :func:`default_workers`)."""
    on_device = place_on_device(data_on_device, data, device)
    if on_device:
        workers = 0
    elif workers is None:
        workers = default_workers(device, local_world_size)
    return Feed(device, batch_size, on_device, workers, channels_last)


def place_on_device(choice: str, data: DataSplits, device: torch.device) -> bool:
    """Whether to hold ``data`` on ``device``: ``on``, ``off``, or ``auto`` (CUDA, if it fits).

    ``on`` works on the CPU device too (the tests use it there); it is refused for a dataset
    that does not come as tensors (an image folder).
    """
    if choice not in DATA_ON_DEVICE_CHOICES:
        raise ValueError(f"unknown --data-on-device {choice!r}; use auto, on or off")
    if choice == "off":
        return False
    if data.in_memory is None:
        if choice == "on":
            raise ValueError(
                "--data-on-device on: this dataset is not held in memory "
                "(only synthetic, MNIST and CIFAR-10 are); use auto or off"
            )
        return False
    if choice == "on":
        return True
    return device.type == "cuda" and fits_on_device(data.in_memory.nbytes, device)


def fits_on_device(nbytes: int, device: torch.device) -> bool:
    """True when ``nbytes`` is at most :data:`DEVICE_MEMORY_SHARE` of ``device``'s free memory."""
    free, _total = torch.cuda.mem_get_info(device)
    return nbytes <= free * DEVICE_MEMORY_SHARE


def default_workers(device: torch.device, local_world_size: int) -> int:
    """DataLoader workers when ``--workers`` is not given.

    0 on CPU: the rank's own threads already use its cores. On CUDA this rank's fair share of
    the usable cores (:func:`ddptui.rank.cpus.threads_per_rank`), less one for the rank itself.
    """
    if device.type != "cuda":
        return 0
    return max(1, threads_per_rank(local_world_size) - 1)


def train_batches(
    data: DataSplits, feed: Feed, *, rank: int, world_size: int, seed: int
) -> Batches:
    """This rank's training batches: its ``DistributedSampler`` shard, augmented."""

    def sampler(size: int) -> DistributedSampler:
        return DistributedSampler(
            range(size),  # type: ignore[arg-type]  # the sampler only needs the length
            num_replicas=world_size,
            rank=rank,
            shuffle=True,
            seed=seed,
        )

    if feed.on_device:
        memory = _in_memory(data)
        return DeviceBatches(
            memory.train_images,
            memory.train_labels,
            sampler(len(memory.train_labels)),
            feed,
            mean=memory.mean,
            std=memory.std,
            crop_padding=memory.crop_padding,
            flip=memory.flip,
        )
    return LoaderBatches(data.train, sampler(len(data.train)), feed)  # type: ignore[arg-type]


def eval_batches(data: DataSplits, feed: Feed, *, rank: int, world_size: int) -> Batches:
    """This rank's evaluation batches: its :func:`shard_indices`, never augmented."""
    if feed.on_device:
        memory = _in_memory(data)
        order = shard_indices(len(memory.test_labels), rank, world_size)
        return DeviceBatches(
            memory.test_images, memory.test_labels, order, feed, mean=memory.mean, std=memory.std
        )
    order = shard_indices(len(data.test), rank, world_size)  # type: ignore[arg-type]
    return LoaderBatches(data.test, order, feed)


def _in_memory(data: DataSplits) -> InMemory:
    if data.in_memory is None:
        raise ValueError("this dataset has no in-memory form to hold on the device")
    return data.in_memory


Order = DistributedSampler | Sequence[int]
"""Which samples, in which order: a sampler (training, reshuffled per epoch) or fixed indices."""


class LoaderBatches:
    """The host path: a DataLoader over ``order``, each batch copied to the device."""

    def __init__(self, dataset: Dataset, order: Order, feed: Feed) -> None:
        self._order = order
        self._device = feed.device
        cuda = feed.device.type == "cuda"
        self._memory_format = torch.channels_last if feed.channels_last else torch.preserve_format
        # A worker prepares one batch at a time: more workers than batches would only idle.
        workers = min(feed.workers, math.ceil(len(order) / feed.batch_size))
        self.loader = DataLoader(
            dataset,
            batch_size=feed.batch_size,
            sampler=order,
            num_workers=workers,
            pin_memory=cuda,
            persistent_workers=workers > 0,
        )

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        if isinstance(self._order, DistributedSampler):
            self._order.set_epoch(epoch)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        device, memory_format = self._device, self._memory_format
        for inputs, targets in self.loader:
            # From pinned memory these copies are asynchronous: the loop runs ahead.
            yield (
                inputs.to(device, non_blocking=True, memory_format=memory_format),
                targets.to(device, non_blocking=True),
            )


class DeviceBatches:
    """The device path: the whole split on the device; batches indexed and prepared there.

    ``images`` (N, C, H, W) are uint8 pixels (scaled to [0, 1], then normalised with
    ``mean``/``std`` as torchvision's ``ToTensor`` + ``Normalize``) or float images (only
    normalised, if ``mean`` is given). ``crop_padding`` and ``flip`` are the training
    augmentation (:func:`random_crop`, :func:`random_flip`), drawn from torch's global RNG on
    the device. The order's indices go to the device once per epoch, asynchronously; no
    step waits for the device.
    """

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        order: Order,
        feed: Feed,
        *,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        crop_padding: int = 0,
        flip: bool = False,
    ) -> None:
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        device = feed.device
        self.images = images.contiguous().to(device)  # (C, H, W) order made on the host
        self.labels = labels.to(device, dtype=torch.long)
        self._order = order
        self._batch_size = feed.batch_size
        self._channels_last = feed.channels_last
        self._crop_padding = crop_padding
        self._flip = flip
        self._mean = self._std = None
        if mean is not None and std is not None:
            channels = (1, -1, 1, 1)
            self._mean = torch.tensor(mean, dtype=torch.float32, device=device).view(channels)
            self._std = torch.tensor(std, dtype=torch.float32, device=device).view(channels)
        self._indices: Tensor | None = None  # this epoch's order, on the device

    def __len__(self) -> int:
        return math.ceil(len(self._order) / self._batch_size)

    def set_epoch(self, epoch: int) -> None:
        if isinstance(self._order, DistributedSampler):
            self._order.set_epoch(epoch)
            self._indices = None

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        if self._indices is None:
            # Once per epoch: the sampler's order as one tensor on the device. From pinned
            # memory the copy is asynchronous, so not even this waits for the GPU.
            order = torch.tensor(list(self._order), dtype=torch.long)
            if self.images.is_cuda:
                order = order.pin_memory()
            self._indices = order.to(self.images.device, non_blocking=True)
        indices, size = self._indices, self._batch_size
        for start in range(0, len(indices), size):
            batch = indices[start : start + size]
            yield self.prepare(self.images[batch]), self.labels[batch]

    def prepare(self, images: Tensor) -> Tensor:
        """Augment (if configured), scale, normalise and lay out one batch of images."""
        if self._crop_padding:
            images = random_crop(images, self._crop_padding)
        if self._flip:
            images = random_flip(images)
        if not images.is_floating_point():
            images = images.float().div(255)  # exactly torchvision's ToTensor
        if self._mean is not None:
            images = images.sub(self._mean).div(self._std)  # exactly its Normalize
        if self._channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images


def random_crop(images: Tensor, padding: int) -> Tensor:
    """Each image cropped back to its size at a random offset after ``padding`` zero pixels
    on every side (torchvision's ``RandomCrop(size, padding)``, for a whole batch at once)."""
    count, channels, height, width = images.shape
    device = images.device
    padded = F.pad(images, (padding, padding, padding, padding))
    offsets = torch.randint(0, 2 * padding + 1, (count, 2), device=device)
    rows = offsets[:, :1] + torch.arange(height, device=device)  # (count, height)
    cols = offsets[:, 1:] + torch.arange(width, device=device)  # (count, width)
    return padded[
        torch.arange(count, device=device).view(-1, 1, 1, 1),
        torch.arange(channels, device=device).view(1, -1, 1, 1),
        rows.view(count, 1, height, 1),
        cols.view(count, 1, 1, width),
    ]


def random_flip(images: Tensor) -> Tensor:
    """Each image mirrored left-right with probability 1/2 (``RandomHorizontalFlip``)."""
    flip = torch.rand(images.shape[0], device=images.device) < 0.5
    return torch.where(flip.view(-1, 1, 1, 1), images.flip(3), images)
