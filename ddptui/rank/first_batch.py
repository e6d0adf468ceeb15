"""Whether the ranks train on the same data: a digest of the first batch a DDP rank trains
on, where its DataLoader has no DistributedSampler. Runs inside training processes.

A DataLoader over a map-style dataset with torch's own ``RandomSampler`` (``shuffle=True``)
or ``SequentialSampler`` gives every rank the whole dataset; seeded alike (the usual
``torch.manual_seed(seed)`` on every rank) or not shuffled, every rank draws the same
batches, DDP averages identical gradients, and the world does one rank's work (kubeflow's
PyTorch MNIST example). The rank sends the digest of its first training batch (a
``first_batch`` note); the dashboard compares them (``diagnosis.same_batches_diagnosis``).
A sampler of any other kind (a DistributedSampler, a script's or a framework's own) and an
IterableDataset (which shards itself, or not) send nothing, as does a batch on a GPU (reading
it would wait for the device).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from typing import Any

from ddptui.protocol import MAX_DIGEST

#: Values of each tensor hashed: from its first samples (dim 0), at most this many.
DIGEST_VALUES = 4096
#: Tensors of a batch hashed, at most (depth first through lists, tuples and dicts).
DIGEST_TENSORS = 4
#: How deep into a batch's lists, tuples and dicts tensors are looked for.
DIGEST_DEPTH = 3


def first_batch_digest(torch: Any, it: Any, batch: Any) -> int | None:
    """The digest of ``batch``, the first training batch DataLoader iterator ``it`` gave, where
    this rank is one of several and ``it`` draws from a map-style dataset through torch's
    ``RandomSampler`` or ``SequentialSampler``; else (or where the batch holds no tensor on
    the CPU) None. Never raises."""
    try:
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        if not _whole_dataset(torch, it):
            return None
        digest = hashlib.blake2b(digest_size=8)
        hashed = 0
        for tensor in _tensors(torch.Tensor, batch, DIGEST_DEPTH):
            if tensor.device.type != "cpu" or tensor.is_sparse:
                return None
            head = tensor.detach()
            if head.dim():  # its first samples, as many as hold DIGEST_VALUES values
                head = head[: max(1, DIGEST_VALUES // max(1, math.prod(head.shape[1:])))]
            values = head.reshape(-1)[:DIGEST_VALUES].contiguous()
            digest.update(f"{values.dtype}{tuple(tensor.shape)}".encode())
            digest.update(values.view(torch.uint8).numpy().tobytes())
            hashed += 1
            if hashed == DIGEST_TENSORS:
                break
        if not hashed:
            return None
        return int.from_bytes(digest.digest(), "big") & MAX_DIGEST
    except Exception:  # a batch or a torch not as expected: no evidence, nothing said
        return None


def _whole_dataset(torch: Any, it: Any) -> bool:
    """``it`` draws from a map-style dataset through torch's own ``RandomSampler`` or
    ``SequentialSampler`` (inside a ``BatchSampler`` or not): every index of the dataset."""
    data = torch.utils.data
    if getattr(it, "_dataset_kind", None) != data.dataloader._DatasetKind.Map:
        return False
    index = getattr(it, "_index_sampler", None)
    sampler = index.sampler if type(index) is data.BatchSampler else index
    return type(sampler) in (data.RandomSampler, data.SequentialSampler)


def _tensors(tensor: type, value: Any, depth: int) -> Iterator[Any]:
    """The ``tensor`` instances in ``value``, depth first through lists, tuples and dicts."""
    if isinstance(value, tensor):
        yield value
    elif depth > 0 and isinstance(value, list | tuple | dict):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _tensors(tensor, item, depth - 1)
