"""A long, CPU-busy preparation before the first step, then ordinary training: every rank
tokenises its own copy of a corpus (hashing words into a vocabulary, as tokenizer training or
dataset pre-processing does) for ``--prep-seconds`` before building DDP. The shape of scripts
such as minGPT-ddp that build their dataset after ``init_process_group``. With
``--rank0-save-seconds S``, after the first epoch rank 0 alone works for S seconds (CPU busy,
as pickling a large checkpoint or a rank-0-only evaluation is), then for S seconds more
writes it out as to slow storage (its CPU idle, its stack in one place, its writes going on),
while the other ranks wait for it in a barrier, as nanoGPT's and most scripts' rank-0
checkpoints make them. Written for
ddptui's tests; no ddptui import.

    torchrun --nproc-per-node 2 long_prep.py [--prep-seconds 8] [--epochs 2] [--steps 8]
"""

import argparse
import hashlib
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from facts import report
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def tokenise(seconds: float, vocab_size: int = 512) -> tuple[dict[str, int], int]:
    """Hash generated words into ``vocab_size`` buckets until ``seconds`` have passed (CPU
    busy all along); returns the word -> id table and how many words were seen."""
    vocab: dict[str, int] = {}
    seen = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(2000):
            word = f"w{seen % 50021}-{seen % 97}"
            digest = hashlib.sha256(word.encode()).digest()
            vocab.setdefault(word, int.from_bytes(digest[:4], "little") % vocab_size)
            seen += 1
    return vocab, seen


def write_slowly(seconds: float, chunk: int = 256 * 1024) -> None:
    """Write ``chunk`` bytes every 50 ms for ``seconds`` (5 MiB/s, the CPU idle), to a file in
    the working directory, removed after: storage slower than the CPU. One line, so that the
    stack stays in one place, as in a long C-level write."""
    end, data = time.monotonic() + seconds, b"\0" * chunk
    with tempfile.NamedTemporaryFile(dir=".") as out:
        while time.monotonic() < end: out.write(data), out.flush(), time.sleep(0.05)  # noqa: E701  # fmt: skip


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--prep-seconds", type=float, default=8.0)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="steps per epoch")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rank0-save-seconds", type=float, default=0.0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    started = time.monotonic()
    vocab, seen = tokenise(args.prep_seconds)
    prep_s = time.monotonic() - started
    print(
        f"rank {rank}: tokenised {seen} words into {len(vocab)} entries in {prep_s:.1f}s",
        flush=True,
    )
    torch.manual_seed(0)
    words = args.steps * args.batch_size * world * 4
    ids = list(vocab.values())
    tokens = torch.tensor([ids[i % len(ids)] for i in range(words)]).view(-1, 4)
    targets = (tokens[:, 0] > tokens[:, 1]).long()
    dataset = TensorDataset(tokens, targets)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Embedding(512, 16), nn.Flatten(), nn.Linear(64, 2))
    )
    optimizer = torch.optim.Adam(model.parameters(), 1e-2)
    steps, last_loss, epoch_steps, save_s = 0, None, {}, 0.0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        epoch_steps[epoch] = 0
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            epoch_steps[epoch] += 1
            last_loss = loss.item()
        if epoch == 0 and args.rank0_save_seconds > 0:
            if rank == 0:  # "saving a checkpoint": the others wait for it
                began = time.monotonic()
                tokenise(args.rank0_save_seconds)
                write_slowly(args.rank0_save_seconds)
                save_s = time.monotonic() - began
            dist.barrier()
    report(
        rank, world, steps, last_loss, epoch_steps, prep_s=round(prep_s, 3), save_s=round(save_s, 3)
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
