"""A plain DDP training script, exactly as one writes it for torchrun: no ddptui import.

Fault injection through environment variables (rank R, epochs counted from 1):

* ``PLAIN_SLOW_DATA_RANK=R``, ``PLAIN_SLOW_DATA_S=S``: rank R's Dataset sleeps S per batch.
* ``PLAIN_SLOW_COMPUTE_RANK=R``, ``PLAIN_EXTRA_MATMULS=N``: rank R runs N extra matmuls
  between forward and backward.
* ``PLAIN_HANG_RANK=R``, ``PLAIN_HANG_EPOCH=E``: rank R stops for good at the start of E.
* ``PLAIN_ASYNC_METRIC=1``: after each step the loss is all-reduced with ``async_op=True``
  and its work waited on (facebookresearch/pycls's ``scaled_all_reduce``); with
  ``PLAIN_HANG_RANK``, rank R stops just before that all-reduce in the first step of E.
* ``PLAIN_FAIL_RANK=R``, ``PLAIN_FAIL_EPOCH=E``: rank R raises at the start of epoch E.

* ``PLAIN_UPLOAD_RANK=R``, ``PLAIN_UPLOAD_TO=FIFO``, ``PLAIN_UPLOAD_BYTES=N``: after the
  first epoch rank R streams an N-byte checkpoint into FIFO, where an uploader drains it
  slowly (as ``aws s3 cp - s3://...`` reading its stdin does): from a thread its main thread
  waits for, the CPU idle; every rank then meets in a barrier.

* ``PLAIN_DOWNLOAD_RANK=R``, ``PLAIN_DOWNLOAD_FROM=FIFO``, ``PLAIN_DOWNLOAD_BYTES=N``: after
  the first epoch rank R reads an N-byte checkpoint from FIFO, fed slowly (a download
  streamed through a pipe), in one C call that keeps the GIL (``fread`` through
  ``ctypes.PyDLL``, as an extension's loader may): its heartbeat cannot beat and its CPU
  idles, only its I/O moves; every rank then meets in a barrier.

* ``PLAIN_PREPARE_S=S``: every rank prepares for S seconds of CPU work (hashing, as a
  tokeniser or an index build would) after ``init_process_group``, before its first step.

* ``PLAIN_NO_DDP=1``: the model is not wrapped in DDP (as pytorch/examples' ImageNet script
  leaves it on the CPU): each rank trains its own; the ranks meet in one barrier before.
* ``PLAIN_NO_SAMPLER=1``: the DataLoader has no DistributedSampler (``shuffle=True``, one seed
  on every rank): each rank trains on the whole dataset, the same batches (kubeflow's PyTorch
  MNIST example).
* ``PLAIN_STEP_S=S``: every step sleeps S more.
* ``PLAIN_THREAD=1``: the whole of ``main`` runs in a thread the main thread joins.
* ``PLAIN_P2P=1``: every step rank 0 sends a tensor to rank 1, as a pipeline's stages pass
  activations: by ``isend``/``irecv``, and every other step in a ``batch_isend_irecv`` of
  ``P2POp``s (as torch.distributed.pipelining does).

Sizes: ``PLAIN_EPOCHS`` (default 2), ``PLAIN_STEPS`` (steps per epoch, default 20),
``PLAIN_BATCH`` (default 16).
"""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def env_int(name, default=-1):
    return int(os.environ.get(name, default))


EPOCHS = env_int("PLAIN_EPOCHS", 2)
STEPS = env_int("PLAIN_STEPS", 20)
BATCH = env_int("PLAIN_BATCH", 16)


class Points(Dataset):
    """Random regression points; sleeps once per batch on the slow-data rank."""

    def __init__(self, size, rank):
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 32, generator=gen)
        self.y = self.x.sum(dim=1, keepdim=True)
        self.sleep = (
            float(os.environ.get("PLAIN_SLOW_DATA_S", "0"))
            if rank == env_int("PLAIN_SLOW_DATA_RANK")
            else 0.0
        )
        self.calls = 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        if self.sleep and self.calls % BATCH == 0:
            time.sleep(self.sleep)
        self.calls += 1
        return self.x[index], self.y[index]


def stall_forever():
    """The injected hang: this rank never reaches its next collective, blocked in one call (a
    loop that sleeps a moment at a time polls: ddptui takes that for work, not a hang)."""
    time.sleep(10**9)


def upload(path, size):
    """The rank-0 checkpoint upload: a thread copies the saved checkpoint into the uploader's
    pipe (64 KiB at a time, as ``shutil.copyfileobj`` does), the main thread waits (its stack
    still, its CPU idle; as fsspec's and boto3's transfers do)."""
    import io
    import shutil
    import threading

    def send():
        with open(path, "wb") as pipe:
            shutil.copyfileobj(io.BytesIO(bytes(size)), pipe)

    sender = threading.Thread(target=send)
    sender.start()
    sender.join()


def download(path, size):
    """Read ``size`` bytes from ``path`` in one ``fread`` that keeps the GIL (its loop of
    ``read`` calls waits on the pipe, the CPU idle)."""
    import ctypes

    libc = ctypes.PyDLL(None)  # a PyDLL call keeps the GIL for its whole length
    libc.fdopen.restype = ctypes.c_void_p
    libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
    libc.fread.restype = ctypes.c_size_t
    libc.fread.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    stream = libc.fdopen(os.open(path, os.O_RDONLY), b"rb")
    buffer = ctypes.create_string_buffer(size)
    got = libc.fread(buffer, 1, size, stream)
    libc.fclose(stream)
    if got != size:
        raise RuntimeError(f"read {got} of {size} bytes")


def prepare(seconds):
    """Host work before the first step: busy, its stack inside this one function."""
    import hashlib

    digest, deadline = b"", time.monotonic() + seconds
    while time.monotonic() < deadline:
        digest = hashlib.sha256(digest + b"token").digest()
    return digest


def main():
    dist.init_process_group("gloo")  # env:// from the launcher
    rank, world = dist.get_rank(), dist.get_world_size()
    prepare(float(os.environ.get("PLAIN_PREPARE_S", "0")))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    if os.environ.get("PLAIN_NO_DDP") == "1":
        dist.barrier()
    else:
        model = DistributedDataParallel(model)
    step_s = float(os.environ.get("PLAIN_STEP_S", "0"))
    async_metric = os.environ.get("PLAIN_ASYNC_METRIC") == "1"
    p2p_steps = 0
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if os.environ.get("PLAIN_NO_SAMPLER") == "1":  # every rank the whole data, alike
        data, sampler = Points(STEPS * BATCH, rank), None
        torch.manual_seed(0)
        loader = DataLoader(data, batch_size=BATCH, shuffle=True)
    else:
        data = Points(STEPS * BATCH * world, rank)
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True)
        loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    extra = env_int("PLAIN_EXTRA_MATMULS", 0) if rank == env_int("PLAIN_SLOW_COMPUTE_RANK") else 0
    busy = torch.randn(192, 192)
    for epoch in range(1, EPOCHS + 1):
        if sampler is not None:
            sampler.set_epoch(epoch)
        hangs = rank == env_int("PLAIN_HANG_RANK") and epoch == env_int("PLAIN_HANG_EPOCH")
        if hangs and not async_metric:
            stall_forever()
        if rank == env_int("PLAIN_FAIL_RANK") and epoch == env_int("PLAIN_FAIL_EPOCH"):
            raise RuntimeError(f"injected failure on rank {rank} at epoch {epoch}")
        for x, y in loader:
            out = model(x)
            loss = torch.nn.functional.mse_loss(out, y)
            for _ in range(extra):
                busy = torch.tanh(busy @ busy)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if async_metric:  # the step's loss averaged over the ranks, as pycls does
                if hangs:
                    stall_forever()
                metric = loss.detach().clone()
                dist.all_reduce(metric, async_op=True).wait()
            if os.environ.get("PLAIN_P2P") == "1" and rank < 2:
                peer = torch.zeros(4)
                op = dist.isend if rank == 0 else dist.irecv
                if (p2p_steps := p2p_steps + 1) % 2:
                    op(peer, 1 - rank).wait()
                else:
                    for request in dist.batch_isend_irecv([dist.P2POp(op, peer, 1 - rank)]):
                        request.wait()
            if step_s:
                time.sleep(step_s)
        if epoch == 1 and os.environ.get("PLAIN_UPLOAD_TO"):
            if rank == env_int("PLAIN_UPLOAD_RANK"):
                upload(os.environ["PLAIN_UPLOAD_TO"], env_int("PLAIN_UPLOAD_BYTES"))
            dist.barrier()
        if epoch == 1 and os.environ.get("PLAIN_DOWNLOAD_FROM"):
            if rank == env_int("PLAIN_DOWNLOAD_RANK"):
                download(os.environ["PLAIN_DOWNLOAD_FROM"], env_int("PLAIN_DOWNLOAD_BYTES"))
            dist.barrier()
    print(f"rank {rank} done, last loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if os.environ.get("PLAIN_THREAD") == "1":
        # the whole loop in a thread the main thread joins
        import threading

        trainer = threading.Thread(target=main, name="trainer")
        trainer.start()
        trainer.join()
    else:
        main()
