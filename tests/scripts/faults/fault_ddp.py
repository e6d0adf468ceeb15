"""A small DDP script (no ddptui import) with one fault on one rank, for the fault matrix.

``FAULT`` picks the fault; ``FAULT_RANK`` (default: the last rank) commits it at step
``FAULT_STEP`` (default 6) of ``FAULT_STEPS`` (default 12). Each step is a DDP step plus a
metrics ``all_reduce`` of the loss, as training scripts do.

Faults: ``extra`` (one collective more: a broadcast), ``skip`` (the metrics all_reduce left
out), ``sleep`` (sleeps ``FAULT_SLEEP_S``, default 3600, just before the metrics all_reduce),
``shape`` (the metrics all_reduce with another shape), ``dtype`` (with another dtype), ``loader`` (a
DataLoader worker that deadlocks), ``kill`` (SIGKILL to itself), ``loop`` (an endless Python
loop). Healthy controls: ``slow_start`` (``FAULT_SLEEP_S`` of busy preparation before the
first step, on every rank), ``slow_step`` (one step ``FAULT_SLEEP_S`` of busy work longer, on
every rank), ``uneven`` (the last batch is smaller), ``none``. ``FAULT_MARK`` names a file the
faulty rank writes when it commits the fault (time, rank, the collective's sequence number).
"""

import json
import os
import signal
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

FAULT = os.environ.get("FAULT", "none")
STEPS = int(os.environ.get("FAULT_STEPS", "12"))
STEP = int(os.environ.get("FAULT_STEP", "6"))
SLEEP_S = float(os.environ.get("FAULT_SLEEP_S", "3600"))
BATCH = 8


class Points(Dataset):
    """Random points; with ``loader``, the faulty rank's worker deadlocks at item ``at``."""

    def __init__(self, size, deadlock_at=None):
        self.x = torch.randn(size, 16, generator=torch.Generator().manual_seed(0))
        self.deadlock_at = deadlock_at

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        if self.deadlock_at is not None and index >= self.deadlock_at:
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()  # a worker that deadlocks: it never returns this item
        return self.x[index], self.x[index].sum(0, keepdim=True)


def mark(rank):
    """Write down the fault: when, on which rank, and the sequence number of the collective it
    concerns (the next one this rank enters; torch's own count), for the fault matrix."""
    path = os.environ.get("FAULT_MARK")
    if not path:
        return
    status = json.loads(torch._C._distributed_c10d._dump_fr_trace_json(False, True, "gloo"))
    enqueued = max(int(s["last_enqueued_collective"]) for s in status["pg_status"].values())
    with open(path, "w") as f:
        json.dump({"t": time.time(), "rank": rank, "seq": enqueued + 1}, f)


def load_batch(batches):
    return next(batches)


def report_loss(loss):
    """The metrics all_reduce of every step."""
    total = loss.detach().reshape(1)
    dist.all_reduce(total)
    return total


def prepare(seconds):
    """Busy preparation (building a dataset, say): the CPU works, the stack moves."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n = sum(range(1000)) + n % 7
    return n


def spin():
    n = 0
    while True:
        n += 1


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    bad = rank == int(os.environ.get("FAULT_RANK", world - 1))
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    size = STEPS * BATCH - (3 if FAULT == "uneven" else 0)
    data = Points(size, deadlock_at=(STEP - 1) * BATCH if FAULT == "loader" and bad else None)
    loader = DataLoader(data, batch_size=BATCH, num_workers=1 if FAULT == "loader" else 0)
    batches = iter(loader)
    if FAULT == "slow_start":
        prepare(SLEEP_S)
    for step in range(1, STEPS + 1):
        at = step == STEP
        if at and FAULT == "slow_step":
            prepare(SLEEP_S)
        if at and bad and FAULT == "loader":
            mark(rank)
        x, y = load_batch(batches)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if at and bad and FAULT not in ("loader", "none", "uneven"):
            mark(rank)
        if at and bad:
            if FAULT == "extra":
                dist.broadcast(torch.ones(1), src=0)  # a collective the others never call
            elif FAULT == "sleep":
                time.sleep(SLEEP_S)
            elif FAULT == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif FAULT == "loop":
                spin()
        if at and bad and FAULT == "skip":
            continue
        if at and bad and FAULT == "shape":
            dist.all_reduce(torch.ones(3))
        elif at and bad and FAULT == "dtype":
            dist.all_reduce(loss.detach().reshape(1).double())
        else:
            report_loss(loss)
    dist.barrier()
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
