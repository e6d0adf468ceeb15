"""How batches reach the device (trainers.batches), on the CPU device; on CUDA with `gpu`.

The sample order is checked through images whose every pixel is their own index, so each
batch says exactly which samples it holds.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from torch.utils.data import DistributedSampler

from tests.trainer_data import write_cifar10, write_mnist
from trainers.batches import (
    DeviceBatches,
    Feed,
    LoaderBatches,
    choose_feed,
    default_workers,
    eval_batches,
    place_on_device,
    random_crop,
    random_flip,
    train_batches,
)
from trainers.datasets import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    DataSplits,
    InMemory,
    cifar10_splits,
    mnist_splits,
    synthetic_splits,
)

CPU = torch.device("cpu")
DEVICES = [
    pytest.param(CPU, id="cpu"),
    pytest.param(
        torch.device("cuda", 0),
        id="cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        ],
    ),
]


def indexed(train: int, test: int = 0) -> DataSplits:
    """Splits whose images (1x2x2 floats) and labels are their own index."""

    def split(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.arange(size)
        return index.float().view(-1, 1, 1, 1).expand(-1, 1, 2, 2).contiguous(), index

    train_images, train_labels = split(train)
    test_images, test_labels = split(test)
    data = torch.utils.data.TensorDataset
    return DataSplits(
        train=data(train_images, train_labels),
        test=data(test_images, test_labels),
        num_classes=max(train, test, 1),
        in_memory=InMemory(train_images, train_labels, test_images, test_labels),
    )


def epoch_indices(data, world_size, epoch, *, device=CPU, on_device=True, batch_size=4):
    """Per rank, the sample indices of one training epoch, batch by batch, checked."""
    feed = Feed(device, batch_size, on_device=on_device)
    per_rank = []
    for rank in range(world_size):
        batches = train_batches(data, feed, rank=rank, world_size=world_size, seed=3)
        batches.set_epoch(epoch)
        seen = []
        for images, labels in batches:
            assert images.device.type == labels.device.type == device.type
            assert torch.equal(images[:, 0, 0, 0].long(), labels)  # image and label agree
            seen += labels.tolist()
        assert len(batches) == -(-len(seen) // batch_size)
        per_rank.append(seen)
    return per_rank


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_index_exactly_once_per_epoch(world_size, device):
    data = indexed(24)  # divisible by 1, 2 and 3: no padding
    for epoch in (0, 1):
        per_rank = epoch_indices(data, world_size, epoch, device=device)
        assert sorted(itertools.chain(*per_rank)) == list(range(24))
        assert len({len(seen) for seen in per_rank}) == 1  # equal shares: DDP steps agree


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("size", [10, 11, 2])
def test_uneven_sizes_pad_like_distributed_sampler(world_size, size):
    """Every index at least once; the few repeats are the permutation's first indices, as
    DistributedSampler pads, so every rank takes the same number of steps."""
    per_rank = epoch_indices(indexed(size), world_size, epoch=5)
    counts = Counter(itertools.chain(*per_rank))
    assert set(counts) == set(range(size))
    padding = -size % world_size
    assert sum(counts.values()) == size + padding
    assert len({len(seen) for seen in per_rank}) == 1
    sampler = DistributedSampler(range(size), num_replicas=world_size, rank=0, seed=3)
    sampler.set_epoch(5)
    permutation = torch.randperm(size, generator=torch.Generator().manual_seed(3 + 5)).tolist()
    assert sorted(i for i, n in counts.items() for _ in range(n - 1)) == sorted(
        (permutation * world_size)[:padding]
    )
    assert per_rank[0] == list(sampler)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_device_path_takes_the_host_path_order(world_size):
    data = indexed(23)
    for epoch in (0, 4):
        device_order = epoch_indices(data, world_size, epoch, on_device=True)
        host_order = epoch_indices(data, world_size, epoch, on_device=False)
        assert device_order == host_order


def test_set_epoch_reshuffles_and_the_same_epoch_repeats():
    data = indexed(64)
    orders = [epoch_indices(data, 2, epoch)[0] for epoch in (0, 1, 2, 1)]
    assert orders[0] != orders[1] != orders[2]
    assert orders[1] == orders[3]
    batches = train_batches(data, Feed(CPU, 8, on_device=True), rank=0, world_size=1, seed=0)
    batches.set_epoch(7)
    once = [labels.tolist() for _, labels in batches]
    again = [labels.tolist() for _, labels in batches]  # a second pass without set_epoch
    assert once == again


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("size", [0, 2, 7, 24])
def test_eval_batches_cover_the_test_set_exactly_once(world_size, size, device):
    data = indexed(4, test=size)
    seen = []
    for rank in range(world_size):
        feed = Feed(device, 3, on_device=True)
        batches = eval_batches(data, feed, rank=rank, world_size=world_size)
        labels = [label for _, batch in batches for label in batch.tolist()]
        assert len(batches) == -(-len(labels) // 3)
        seen += labels
    assert sorted(seen) == list(range(size))


def pixels(count: int, channels: int = 3, size: int = 8, seed: int = 0) -> torch.Tensor:
    """Random uint8 images (N, C, H, W) with no zero pixel, so padding is recognisable."""
    rng = torch.Generator().manual_seed(seed)
    return torch.randint(1, 256, (count, channels, size, size), dtype=torch.uint8, generator=rng)


@pytest.mark.parametrize("device", DEVICES)
def test_random_crop_takes_a_window_of_the_padded_image(device):
    images = pixels(64).to(device)
    cropped = random_crop(images, 2)
    assert cropped.shape == images.shape and cropped.dtype == torch.uint8
    padded = torch.nn.functional.pad(images, (2, 2, 2, 2))
    offsets = set()
    for index in range(len(images)):
        windows = [
            (dy, dx)
            for dy, dx in itertools.product(range(5), repeat=2)
            if torch.equal(cropped[index], padded[index, :, dy : dy + 8, dx : dx + 8])
        ]
        assert len(windows) == 1, index
        offsets.add(windows[0])
    assert len(offsets) > 10  # random offsets, not one shift for the whole batch


@pytest.mark.parametrize("device", DEVICES)
def test_random_flip_mirrors_about_half(device):
    images = pixels(200).to(device)
    flipped = random_flip(images)
    same = [torch.equal(flipped[i], images[i]) for i in range(200)]
    mirrored = [torch.equal(flipped[i], images[i].flip(2)) for i in range(200)]
    assert all(a != b for a, b in zip(same, mirrored, strict=True))
    assert 60 < sum(mirrored) < 140


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_augmented_batches_shape_dtype_and_range(device, channels_last):
    images, labels = pixels(50, size=32), torch.arange(50) % 10
    images[:, :, :2] = 0  # some black, some white pixels: the range's both ends
    images[:, :, -2:] = 255
    memory = InMemory(
        images, labels, images[:5], labels[:5], CIFAR10_MEAN, CIFAR10_STD, crop_padding=4, flip=True
    )
    dataset = torch.utils.data.TensorDataset(images, labels)
    data = DataSplits(dataset, dataset, 10, memory)
    feed = Feed(device, 16, on_device=True, channels_last=channels_last)
    batches = train_batches(data, feed, rank=0, world_size=1, seed=0)
    mean = torch.tensor(CIFAR10_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD, device=device).view(1, 3, 1, 1)
    shapes = []
    for batch, batch_labels in batches:
        shapes.append(tuple(batch.shape))
        assert batch.dtype == torch.float32 and batch_labels.dtype == torch.long
        assert batch.is_contiguous(memory_format=torch.channels_last) == channels_last
        low, high = (0 - mean) / std, (1 - mean) / std
        assert bool(((batch >= low - 1e-6) & (batch <= high + 1e-6)).all())
        assert bool(torch.isclose(batch, low).any())  # zero padding / black pixels
    assert shapes == [(16, 3, 32, 32)] * 3 + [(2, 3, 32, 32)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("trainer", ["cifar10", "mnist"])
def test_unaugmented_eval_batches_equal_the_host_path(trainer, device, tmp_path):
    """The device path's scaling and normalisation are torchvision's ToTensor + Normalize."""
    if trainer == "cifar10":
        write_cifar10(tmp_path, per_batch=3, test=9)
        data = cifar10_splits(tmp_path, verify=False)
    else:
        write_mnist(tmp_path, train=6, test=9)
        data = mnist_splits(tmp_path)
    for world_size, rank in [(1, 0), (2, 1)]:
        host, held = (
            list(
                eval_batches(data, Feed(device, 4, on_device=on), rank=rank, world_size=world_size)
            )
            for on in (False, True)
        )
        assert len(host) == len(held) > 0
        for (host_images, host_labels), (images, labels) in zip(host, held, strict=True):
            assert images.device == host_images.device and images.device.type == device.type
            assert torch.equal(labels, host_labels)
            if device.type == "cpu":
                assert torch.equal(images, host_images)
            else:  # the same arithmetic, on another processor
                torch.testing.assert_close(images, host_images, rtol=0, atol=1e-6)


def test_cifar10_training_batches_hold_the_same_pixels_as_the_files(tmp_path):
    """The in-memory tensors are the dataset's images in (C, H, W) order."""
    write_cifar10(tmp_path, per_batch=2, test=3)
    data = cifar10_splits(tmp_path, verify=False)
    memory = data.in_memory
    assert memory.train_images.shape == (10, 3, 32, 32) and memory.train_images.dtype == torch.uint8
    assert memory.crop_padding == 4 and memory.flip
    test_image, test_label = data.test[2]
    normalised = (
        memory.test_images[2].float() / 255 - torch.tensor(CIFAR10_MEAN).view(3, 1, 1)
    ) / (torch.tensor(CIFAR10_STD).view(3, 1, 1))
    torch.testing.assert_close(normalised, test_image)
    assert int(memory.test_labels[2]) == test_label


def test_first_keeps_the_in_memory_splits_in_step():
    data = synthetic_splits(50, 20, seed=0).first(30, 7)
    assert len(data.train) == 30 and len(data.test) == 7
    assert data.in_memory.train_images.shape[0] == 30 and data.in_memory.test_labels.shape == (7,)
    assert torch.equal(data.in_memory.train_images, data.train[:][0])


def test_in_memory_rejects_inconsistent_tensors():
    images = torch.zeros(4, 1, 2, 2)
    with pytest.raises(ValueError, match="N labels"):
        InMemory(images, torch.zeros(3), images, torch.zeros(4))
    with pytest.raises(ValueError, match="both mean and std"):
        InMemory(images, torch.zeros(4), images, torch.zeros(4), mean=(0.5,))
    with pytest.raises(ValueError, match="std must be positive"):
        InMemory(images, torch.zeros(4), images, torch.zeros(4), mean=(0.5,), std=(0.0,))


# -- choosing the path ---------------------------------------------------------------------
def test_auto_keeps_the_dataloader_on_cpu():
    feed = choose_feed(indexed(8), CPU, batch_size=4)
    assert not feed.on_device and feed.workers == 0
    assert isinstance(train_batches(indexed(8), feed, rank=0, world_size=1, seed=0), LoaderBatches)
    on = choose_feed(indexed(8), CPU, batch_size=4, data_on_device="on", workers=3)
    assert on.on_device and on.workers == 0
    assert isinstance(train_batches(indexed(8), on, rank=0, world_size=1, seed=0), DeviceBatches)


@pytest.mark.parametrize(("free", "expected"), [(10**9, True), (100, False)])
def test_auto_on_cuda_holds_the_data_when_it_fits(monkeypatch, free, expected):
    calls = []

    def mem_get_info(device):
        calls.append(device)
        return free, 2 * free

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    cuda = torch.device("cuda", 0)
    assert place_on_device("auto", indexed(8), cuda) is expected
    assert calls == [cuda]
    assert place_on_device("off", indexed(8), cuda) is False


def test_on_is_refused_for_data_not_in_memory():
    folder_like = DataSplits(indexed(4).train, indexed(4).test, 4)
    with pytest.raises(ValueError, match="not held in memory"):
        place_on_device("on", folder_like, CPU)
    assert place_on_device("auto", folder_like, torch.device("cuda", 0)) is False
    with pytest.raises(ValueError, match="unknown --data-on-device"):
        place_on_device("yes", indexed(4), CPU)


def test_default_workers_share_the_cores_on_cuda_only(monkeypatch):
    monkeypatch.setenv("DDPTUI_THREADS", "6")  # the launcher's share of the cores per rank
    assert default_workers(CPU, 2) == 0
    assert default_workers(torch.device("cuda", 1), 2) == 5
    monkeypatch.setenv("DDPTUI_THREADS", "1")
    assert default_workers(torch.device("cuda", 0), 8) == 1
    monkeypatch.delenv("DDPTUI_THREADS")
    monkeypatch.setattr("ddptui.rank.cpus.usable_cpus", lambda: 16)
    assert default_workers(torch.device("cuda", 0), 4) == 3
    feed = choose_feed(
        DataSplits(indexed(4).train, indexed(4).test, 4),
        torch.device("cuda", 0),
        batch_size=2,
        local_world_size=2,
    )
    assert feed.workers == 7 and "7 workers, pinned" in feed.describe()


def test_host_batches_copy_to_the_device_in_channels_last():
    data = indexed(6)
    feed = Feed(CPU, 4, channels_last=True)
    batches = train_batches(data, feed, rank=0, world_size=1, seed=0)
    images, _ = next(iter(batches))
    assert images.is_contiguous(memory_format=torch.channels_last)


def test_loader_workers_are_persistent_pinned_on_cuda_and_never_idle():
    feed = Feed(CPU, 4, workers=8)
    batches = train_batches(indexed(10), feed, rank=0, world_size=2, seed=0)  # 5: 2 batches
    loader = batches.loader
    assert (loader.num_workers, loader.persistent_workers, loader.pin_memory) == (2, True, False)
    empty = eval_batches(indexed(4, test=1), feed, rank=1, world_size=2).loader
    assert (empty.num_workers, empty.persistent_workers) == (0, False)
    cuda = Feed(torch.device("cuda", 0), 4, workers=1)
    assert train_batches(indexed(10), cuda, rank=0, world_size=1, seed=0).loader.pin_memory
