"""Whether the ranks train on the same data: the first batch's digest (the rank's side) and
the run's comparison of the ranks' digests."""

import msgspec
import pytest
import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    SequentialSampler,
    Subset,
    TensorDataset,
)

from ddptui import protocol
from ddptui.rank.first_batch import (
    DIGEST_VALUES,
    batch_rows,
    first_batch_digest,
    trained_digest,
)
from ddptui.run.diagnosis import Diagnoser, same_batches_diagnosis
from ddptui.run.state import RunState


@pytest.fixture
def world(monkeypatch):
    """A process group of ``size`` ranks, as far as the digest asks (set ``world.size``)."""

    class World:
        size = 2

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: World.size)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    return World


def first(loader):
    it = iter(loader)
    return first_batch_digest(torch, it, next(it))


def data(n=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 6, generator=gen), torch.arange(n))


def test_ranks_shuffling_the_whole_dataset_alike_draw_one_digest(world):
    """kubeflow's PyTorch MNIST example: ``shuffle=True`` and ``torch.manual_seed(seed)`` on
    every rank: the ranks' first batches, and digests, are the same."""
    digests = []
    for _ in range(2):  # two ranks
        torch.manual_seed(1)
        digests.append(first(DataLoader(data(), batch_size=8, shuffle=True)))
    assert digests[0] == digests[1] and 0 <= digests[0] <= protocol.MAX_DIGEST
    torch.manual_seed(2)  # seeded apart: another order, another digest
    assert first(DataLoader(data(), batch_size=8, shuffle=True)) != digests[0]
    # not shuffled: the same too; another dataset (a rank's own part): another digest
    plain = first(DataLoader(data(), batch_size=8))
    assert plain == first(DataLoader(data(), batch_size=8, sampler=SequentialSampler(data())))
    assert plain != first(DataLoader(data(seed=1), batch_size=8))
    assert plain != first(DataLoader(Subset(data(), range(20, 40)), batch_size=8))
    # one more sample in the batch, or another dtype: other batches
    assert plain != first(DataLoader(data(), batch_size=9))


def test_no_digest_where_the_data_is_shared_out_or_there_is_one_rank(world):
    dataset = data()
    sharded = DistributedSampler(dataset, num_replicas=2, rank=0)
    assert first(DataLoader(dataset, batch_size=8, sampler=sharded)) is None
    assert first(DataLoader(dataset, batch_size=8, sampler=list(range(40)))) is None  # own

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.randn(16, 3))

    assert first(DataLoader(Stream(), batch_size=4)) is None
    world.size = 1
    assert first(DataLoader(dataset, batch_size=8)) is None


@pytest.mark.parametrize(
    "batch",
    [
        {"input_ids": torch.arange(12).reshape(3, 4), "labels": torch.ones(3)},
        [torch.zeros(2, 3, dtype=torch.bfloat16), [torch.ones(2, dtype=torch.bool)]],
        (torch.tensor(3.0),),  # 0-dim
        torch.randn(50_000, 7),  # many samples: only the first ones read
        torch.randn(2, 9000),  # one sample beyond DIGEST_VALUES: its first values
        torch.empty(0, 5),
    ],
)
def test_a_digest_of_any_batch_of_tensors(world, batch):
    it = iter(DataLoader(data(), batch_size=4))
    digest = first_batch_digest(torch, it, batch)
    assert digest is not None and 0 <= digest <= protocol.MAX_DIGEST
    assert first_batch_digest(torch, it, batch) == digest


def test_the_digest_reads_a_bounded_head_of_each_tensor(world, monkeypatch):
    """A batch of 50,000 samples: its first samples' values, not the whole tensor."""
    it = iter(DataLoader(data(), batch_size=4))
    big = torch.randn(50_000, 7)
    changed = big.clone()
    changed[-1] += 1  # the last sample: beyond what is read
    assert first_batch_digest(torch, it, big) == first_batch_digest(torch, it, changed)
    changed[0] += 1
    assert first_batch_digest(torch, it, big) != first_batch_digest(torch, it, changed)
    wide = torch.randn(1, 2 * DIGEST_VALUES)
    tail = wide.clone()
    tail[0, -1] += 1
    assert first_batch_digest(torch, it, wide) == first_batch_digest(torch, it, tail)


@pytest.mark.parametrize("batch", [None, "text", [1, 2], {"a": [[["deep"]]]}, object()])
def test_no_digest_of_a_batch_without_tensors(world, batch):
    it = iter(DataLoader(data(), batch_size=4))
    assert first_batch_digest(torch, it, batch) is None


def test_the_digest_a_rank_trains_on_holds_what_its_forward_took(world):
    """facebookresearch/dlrm: every rank draws the whole batch and feeds its DDP modules its
    own slice. On the CPU the forward's inputs are hashed with the batch: the whole batch
    fed alike, one digest on every rank; each rank's slice, one each. On a device (here the
    meta device: unread, as a GPU's would be) fewer rows than the batch is a part of it, and
    there is no evidence either way: None; as many rows, the batch's digest."""
    batch = torch.randn(8, 6)
    digest = first_batch_digest(torch, iter(DataLoader(data(), batch_size=8)), (batch,))
    assert batch_rows(torch, (batch, torch.arange(8))) == 8
    assert batch_rows(torch, {"x": torch.tensor(1.0)}) is None
    assert batch_rows(torch, "text") is None

    def trained(*args, **kwargs):
        return trained_digest(torch, digest, 8, args, kwargs)

    whole = trained(batch)
    assert whole == trained(batch.clone()) and whole != digest
    assert 0 <= whole <= protocol.MAX_DIGEST
    assert trained(batch[:4]) != trained(batch[4:])
    assert trained(x=batch[:4]) == trained(x=batch[:4].clone())
    assert trained() == digest and trained("no tensor", 3) == digest  # nothing to read
    on_device = torch.empty(8, 6, device="meta")
    assert trained(on_device[:4]) is None
    assert trained(on_device) == digest
    assert trained_digest(torch, digest, None, (on_device[:4],), {}) == digest


def _state(digests, world=2):
    state = RunState("r", world)
    for rank in range(world):
        state.apply(protocol.Status(run="r", rank=rank, t=0.0, seq=0, state="started"), now=1.0)
    for seq, (rank, digest) in enumerate(digests.items(), start=1):
        note = protocol.Note(run="r", rank=rank, t=0.0, seq=seq, code="first_batch", digest=digest)
        state.apply(note, now=2.0)
    return state


def test_ranks_that_drew_one_first_batch_are_said_to_train_on_the_same_data_once():
    state = _state({0: 77, 1: 77})
    found = same_batches_diagnosis(state, 3.0)
    assert found is not None and (found.rank, found.cause) == (0, "same_batches")
    assert found.detail.startswith(
        "ranks 0 and 1 drew the same first batch from a DataLoader with no DistributedSampler"
    )
    assert "2 do the work of one" in found.detail
    diagnoser = Diagnoser()
    assert [d.cause for d in diagnoser.notes(state)] == ["same_batches"]
    assert diagnoser.notes(state) == []  # once
    four = _state({r: 5 for r in range(4)}, world=4)
    assert same_batches_diagnosis(four, 1.0).detail.startswith("all 4 ranks drew")


@pytest.mark.parametrize(
    "digests, world",
    [
        ({0: 77, 1: 78}, 2),  # seeded apart, or their own parts
        ({0: 77}, 2),  # rank 1 has a DistributedSampler (or has not drawn yet)
        ({0: 7, 1: 7, 2: 8}, 3),
        ({0: 7, 1: 7}, 3),
        ({0: 7}, 1),  # one rank: nothing to compare
    ],
)
def test_no_same_data_note_without_every_ranks_same_digest(digests, world):
    state = _state(digests, world)
    assert same_batches_diagnosis(state, 1.0) is None
    assert Diagnoser().notes(state) == []


@pytest.mark.parametrize("digest", [-1, protocol.MAX_DIGEST + 1, 2**63, 1.5, "7", True])
def test_a_digest_out_of_bounds_is_refused(digest):
    raw = {"kind": "note", "v": 1, "run": "r", "rank": 0, "t": 0.0, "seq": 1}
    raw.update(code="first_batch", digest=digest)
    with pytest.raises(protocol.InvalidEvent):
        protocol.decode_batch(msgspec.msgpack.encode([raw]))
    raw["digest"] = protocol.MAX_DIGEST
    (note,) = protocol.decode_batch(msgspec.msgpack.encode([raw]))
    assert note.digest == protocol.MAX_DIGEST
