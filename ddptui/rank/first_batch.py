"""Whether the ranks train on the same data: a digest of the first batch a DDP rank trains
on, where its DataLoader has no DistributedSampler. Runs inside training processes.

A DataLoader over a map-style dataset with torch's own ``RandomSampler`` (``shuffle=True``)
or ``SequentialSampler`` gives every rank the whole dataset; seeded alike (the usual
``torch.manual_seed(seed)`` on every rank) or not shuffled, every rank draws the same
batches, DDP averages identical gradients, and the world does one rank's work (kubeflow's
PyTorch MNIST example). The rank sends the digest of its first training batch (a
``first_batch`` note) with what its first training forward took of it (:func:`trained_digest`);
the dashboard compares them (``diagnosis.same_batches_diagnosis``). A sampler of any other
kind (a DistributedSampler, a script's or a framework's own) and an IterableDataset (which
shards itself, or not) send nothing, as does a batch on a GPU (reading it would wait for the
device).

The same batch is not the same work where each rank trains on its own part of it:
facebookresearch/dlrm draws the whole global batch on every rank (its embedding tables are
split over the ranks, each looking its tables up for the whole batch) and feeds its DDP
modules the rank's slice (``get_my_slice``); its 2 CPU ranks were told that they "compute the
same gradients and 2 do the work of one". So the forward's inputs count too: hashed with the
batch where they are on the CPU; on a GPU (unread: that would wait for the device), fewer rows
than the batch drew is a part of it, and nothing is said.
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
        return _digest(torch, _first_tensors(torch, batch))
    except Exception:  # a batch or a torch not as expected: no evidence, nothing said
        return None


def batch_rows(torch: Any, batch: Any) -> int | None:
    """The rows (samples, dim 0) of the batch's first tensor; None without one. Never raises."""
    try:
        for tensor in _tensors(torch.Tensor, batch, DIGEST_DEPTH):
            return int(tensor.shape[0]) if tensor.dim() else None
    except Exception:
        pass
    return None


def trained_digest(
    torch: Any, digest: int, rows: int | None, args: tuple, kwargs: dict
) -> int | None:
    """The first batch's ``digest`` (a batch of ``rows`` samples) as the rank trained on it:
    with the digest of its first training forward's tensor inputs (``args``, ``kwargs``)
    where they are on the CPU, so that ranks which feed their DDP modules their own part of
    one batch send different digests; where they are on a GPU, None if the forward took fewer
    rows than the batch holds (a part of it: which part is unread), else the batch's digest.
    Never raises."""
    try:
        tensors = _first_tensors(torch, (args, kwargs), DIGEST_DEPTH + 1)
        if not tensors:
            return digest
        if all(tensor.device.type == "cpu" and not tensor.is_sparse for tensor in tensors):
            taken = _digest(torch, tensors)
            if taken is None:
                return None
            both = hashlib.blake2b(f"{digest}:{taken}".encode(), digest_size=8).digest()
            return int.from_bytes(both, "big") & MAX_DIGEST
        lead = tensors[0]
        if rows is not None and lead.dim() and lead.shape[0] < rows:
            return None
        return digest
    except Exception:  # inputs not as expected: no evidence, nothing said
        return None


def _first_tensors(torch: Any, value: Any, depth: int = DIGEST_DEPTH) -> list[Any]:
    """The first :data:`DIGEST_TENSORS` tensors of ``value``."""
    found = []
    for tensor in _tensors(torch.Tensor, value, depth):
        found.append(tensor)
        if len(found) == DIGEST_TENSORS:
            break
    return found


def _digest(torch: Any, tensors: list[Any]) -> int | None:
    """A hash of the tensors' dtypes, shapes and first values; None without a tensor, or with
    one not on the CPU (reading it would wait for the device) or sparse."""
    if not tensors:
        return None
    digest = hashlib.blake2b(digest_size=8)
    for tensor in tensors:
        if tensor.device.type != "cpu" or tensor.is_sparse:
            return None
        head = tensor.detach()
        if head.dim():  # its first samples, as many as hold DIGEST_VALUES values
            head = head[: max(1, DIGEST_VALUES // max(1, math.prod(head.shape[1:])))]
        values = head.reshape(-1)[:DIGEST_VALUES].contiguous()
        digest.update(f"{values.dtype}{tuple(tensor.shape)}".encode())
        digest.update(values.view(torch.uint8).numpy().tobytes())
    return int.from_bytes(digest.digest(), "big") & MAX_DIGEST


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
