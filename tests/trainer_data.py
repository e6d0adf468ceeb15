"""Tiny datasets in the real on-disk formats, and spawn workers, for the trainer tests.

The files are read back by torchvision's own loaders: MNIST's big-endian IDX files,
CIFAR-10's python pickle batches and an ImageFolder tree of PNGs.
"""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import numpy as np

CIFAR10_CLASSES = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]


def _images(count: int, shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` uint8 images whose brightness depends on their label (0..9)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=count)
    noise = rng.integers(0, 60, size=(count, *shape))
    images = (labels.reshape(-1, *[1] * len(shape)) * 20 + noise).astype(np.uint8)
    return images, labels.astype(np.uint8)


def _write_idx(path: Path, array: np.ndarray) -> None:
    """IDX format: magic (0, 0, type 0x08 = ubyte, ndim), big-endian dims, then the bytes."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def write_mnist(root: Path, train: int = 40, test: int = 11, seed: int = 0) -> Path:
    """MNIST IDX files under ``root/MNIST/raw`` (as torchvision expects); returns ``root``."""
    raw = Path(root) / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, count, split_seed in (("train", train, seed), ("t10k", test, seed + 1)):
        images, labels = _images(count, (28, 28), split_seed)
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    return Path(root)


def write_cifar10(root: Path, per_batch: int = 4, test: int = 7, seed: int = 0) -> Path:
    """CIFAR-10 python batches under ``root/cifar-10-batches-py``; returns ``root``.

    Same pickle layout as the official archive (``data`` N x 3072 uint8 in CHW order,
    ``labels``), but not the official bytes, so loading needs ``--no-verify``.
    """
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    batches = [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch", test)]
    for index, (name, count) in enumerate(batches):
        images, labels = _images(count, (3, 32, 32), seed + index)
        entry = {
            "batch_label": name,
            "labels": [int(label) for label in labels],
            "data": images.reshape(count, 3 * 32 * 32),
            "filenames": [f"{name}_{i}.png" for i in range(count)],
        }
        with open(folder / name, "wb") as file:
            pickle.dump(entry, file)
    meta = {"label_names": CIFAR10_CLASSES, "num_cases_per_batch": per_batch, "num_vis": 3072}
    with open(folder / "batches.meta", "wb") as file:
        pickle.dump(meta, file)
    return Path(root)


def write_imagefolder(
    root: Path,
    classes: tuple[str, ...] = ("cat", "dog", "fox"),
    train: int = 3,
    val: int = 2,
    size: int = 20,
    seed: int = 0,
) -> Path:
    """``root/{train,val}/<class>/<n>.png`` with small RGB PNGs; returns ``root``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split, count in (("train", train), ("val", val)):
        for label, name in enumerate(classes):
            folder = Path(root) / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = (label * 80 + rng.integers(0, 40, size=(size, size, 3))).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return Path(root)


# -- spawn workers (importable by the child processes) ------------------------------------
def eval_worker(
    rank: int, world_size: int, init_method: str, state_path: str, out_dir: str, sizes: list[int]
) -> None:
    """One rank: load the shared weights, evaluate synthetic test sets of ``sizes``.

    Every rank first scrambles its BatchNorm running stats differently, so the result only
    matches single-process evaluation of rank 0's weights if ``sync_buffers`` works. Writes
    ``rank<r>.json`` with one ``[accuracy, loss, count]`` per size.
    """
    import torch
    import torch.distributed as dist

    from trainers.batches import Feed, eval_batches
    from trainers.datasets import synthetic_splits
    from trainers.loop import evaluate, sync_buffers

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    try:
        model = bn_model()
        model.load_state_dict(torch.load(state_path, weights_only=True))
        if rank:
            for buffer in model.buffers():
                if buffer.is_floating_point():
                    buffer.add_(float(rank))
        sync_buffers(model)
        results = []
        cpu = torch.device("cpu")
        for size in sizes:
            data = synthetic_splits(1, size, seed=3)
            shard = eval_batches(data, Feed(cpu, batch_size=4), rank=rank, world_size=world_size)
            result = evaluate(model, shard, device=cpu)
            results.append([result.accuracy, result.loss, result.count])
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def bn_model():
    """SmallCNN with a BatchNorm layer (so evaluation depends on buffers too)."""
    from torch import nn

    from trainers.models import SmallCNN

    model = SmallCNN()
    model.features.insert(1, nn.BatchNorm2d(16))
    return model


def clean_env(monkeypatch) -> None:
    """Run as a plain standalone process: no launcher variables, no telemetry endpoint."""
    for name in (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "DDPTUI_ENDPOINT",
        "DDPTUI_THREADS",
    ):
        monkeypatch.delenv(name, raising=False)
