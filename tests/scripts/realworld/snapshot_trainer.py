"""A ``Trainer`` class with ``_run_batch`` / ``_run_epoch`` and snapshots, started by torchrun:
the shape of pytorch/examples' ddp-tutorial-series ``multigpu_torchrun.py``, on CPU and gloo.
Written for ddptui's real-world tests; no ddptui import.

    torchrun --nproc-per-node 2 snapshot_trainer.py TOTAL_EPOCHS SAVE_EVERY \
        [--batch_size N] [--steps N] [--snapshot_path PATH]

Faults for the tests (environment): ``RW_FAULT`` = ``kill`` (SIGKILL itself), ``raise`` or
``hang`` (block forever outside any collective), on rank ``RW_FAULT_RANK`` (default 1) just
before its step ``RW_FAULT_STEP`` (counted from 1 over the whole run; 1: before any step).
"""

import argparse
import os
import signal
import threading
import time

import torch
import torch.nn.functional as F
from datautils import RandomPairs
from facts import report
from torch.distributed import destroy_process_group, get_rank, get_world_size, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def inject_fault(rank: int, step: int) -> None:
    """The fault the test asked for, if this is its rank and step."""
    kind = os.environ.get("RW_FAULT")
    if not kind or rank != int(os.environ.get("RW_FAULT_RANK", "1")):
        return
    if step != int(os.environ.get("RW_FAULT_STEP", "1")):
        return
    # the wall time too: a test measures from it how soon the fault was noticed
    print(f"injecting {kind} on rank {rank} before step {step} at {time.time()!r}", flush=True)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "raise":
        raise RuntimeError(f"injected failure on rank {rank} at step {step}")
    elif kind == "hang":
        threading.Event().wait()  # the peer waits in the gradient all-reduce for good


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.rank = get_rank()
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.epochs_run = 0
        self.steps = 0
        self.last_loss = None
        self.epoch_steps = {}
        if os.path.exists(snapshot_path):
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, path):
        snapshot = torch.load(path)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        print(f"[rank{self.rank}] Epoch {epoch} | Steps: {len(self.train_data)}", flush=True)
        self.epoch_steps[epoch] = 0
        for source, targets in self.train_data:
            inject_fault(self.rank, self.steps + 1)
            self.last_loss = self._run_batch(source, targets)
            self.steps += 1
            self.epoch_steps[epoch] += 1

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch + 1}
        torch.save(snapshot, self.snapshot_path + ".tmp")
        os.replace(self.snapshot_path + ".tmp", self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(
        dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset)
    )


def main(total_epochs, save_every, batch_size, steps, snapshot_path):
    init_process_group(backend="gloo")
    torch.manual_seed(0)
    world = get_world_size()
    dataset = RandomPairs(steps * batch_size * world)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    trainer = Trainer(
        model, prepare_dataloader(dataset, batch_size), optimizer, save_every, snapshot_path
    )
    trainer.train(total_epochs)
    report(get_rank(), world, trainer.steps, trainer.last_loss, trainer.epoch_steps)
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=16, type=int, help="Input batch size per rank")
    parser.add_argument("--steps", default=12, type=int, help="Steps per epoch")
    parser.add_argument("--snapshot_path", default="snapshot.pt")
    args = parser.parse_args()
    main(args.total_epochs, args.save_every, args.batch_size, args.steps, args.snapshot_path)
