"""DDP combined with torch's distributed RPC, the shape of pytorch/examples'
``distributed/rpc/ddp_rpc/main.py``: ``mp.spawn`` of four processes, two trainers that form
a gloo process group of two and hold an ``nn.Linear`` in DDP, a parameter server that holds
an ``nn.EmbeddingBag`` (a ``RemoteModule``), and a master that runs each trainer's loop over
RPC. A step is ``dist_autograd.backward(context_id, [loss])`` and
``DistributedOptimizer.step(context_id)``; the trainers' main threads wait in
``rpc.shutdown()`` while their loops run in RPC threads. Written for ddptui's tests; no
ddptui import.

    python rpc_trainers.py [--pg-url tcp://127.0.0.1:29500] [--rpc-url tcp://127.0.0.1:29501]

CPU edits, as the original's own comments allow: gloo, no ``.to(rank)``, no GPU count check;
the URLs are options (the original has them fixed), and the epochs and batches are few.
"""

import argparse
import os
import random

import torch
import torch.distributed as dist
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.optim as optim
from facts import report
from torch.distributed.nn import RemoteModule
from torch.distributed.optim import DistributedOptimizer
from torch.distributed.rpc import RRef, TensorPipeRpcBackendOptions
from torch.nn.parallel import DistributedDataParallel as DDP

NUM_EMBEDDINGS = 100
EMBEDDING_DIM = 16

parser = argparse.ArgumentParser(description="DDP with distributed RPC")
parser.add_argument("--pg-url", default="tcp://127.0.0.1:29500")
parser.add_argument("--rpc-url", default="tcp://127.0.0.1:29501")
parser.add_argument("--epochs", default=3, type=int)
parser.add_argument("--batches", default=4, type=int, help="batches per epoch")


class HybridModel(torch.nn.Module):
    def __init__(self, remote_emb_module):
        super().__init__()
        self.remote_emb_module = remote_emb_module
        self.fc = DDP(torch.nn.Linear(EMBEDDING_DIM, 8))

    def forward(self, indices, offsets):
        emb_lookup = self.remote_emb_module.forward(indices, offsets)
        return self.fc(emb_lookup)


def _run_trainer(remote_emb_module, rank, epochs, batches, helpers):
    random.seed(rank)
    torch.manual_seed(rank)
    model = HybridModel(remote_emb_module)
    model_parameter_rrefs = model.remote_emb_module.remote_parameters()
    for param in model.fc.parameters():
        model_parameter_rrefs.append(RRef(param))
    opt = DistributedOptimizer(optim.SGD, model_parameter_rrefs, lr=0.05)
    criterion = torch.nn.CrossEntropyLoss()

    def get_next_batch():
        for _ in range(batches):
            num_indices = random.randint(20, 50)
            indices = torch.LongTensor(num_indices).random_(0, NUM_EMBEDDINGS)
            offsets = []
            start = 0
            batch_size = 0
            while start < num_indices:
                offsets.append(start)
                start += random.randint(1, 10)
                batch_size += 1
            yield indices, torch.LongTensor(offsets), torch.LongTensor(batch_size).random_(8)

    steps, samples, last_loss = 0, 0, None
    for epoch in range(epochs):
        for indices, offsets, target in get_next_batch():
            with dist_autograd.context() as context_id:
                output = model(indices, offsets)
                loss = criterion(output, target)
                dist_autograd.backward(context_id, [loss])
                opt.step(context_id)
            steps, samples, last_loss = steps + 1, samples + len(target), loss.item()
        print(f"Training done for epoch {epoch}", flush=True)
    report(
        rank,
        dist.get_world_size(),
        steps,
        last_loss,
        {},
        samples=samples,
        pid=os.getpid(),
        helper_pids=",".join(map(str, helpers)),
    )


def run_worker(rank, world_size, args):
    options = TensorPipeRpcBackendOptions()
    options.init_method = args.rpc_url
    if rank == 2:  # the master
        rpc.init_rpc("master", rank=rank, world_size=world_size, rpc_backend_options=options)
        remote_emb_module = RemoteModule(
            "ps",
            torch.nn.EmbeddingBag,
            args=(NUM_EMBEDDINGS, EMBEDDING_DIM),
            kwargs={"mode": "sum"},
        )
        helpers = (os.getpid(), rpc.rpc_sync("ps", os.getpid))
        futs = [
            rpc.rpc_async(
                f"trainer{trainer}",
                _run_trainer,
                args=(remote_emb_module, trainer, args.epochs, args.batches, helpers),
            )
            for trainer in (0, 1)
        ]
        for fut in futs:
            fut.wait()
    elif rank <= 1:  # a trainer: its loop comes over RPC
        dist.init_process_group(backend="gloo", rank=rank, world_size=2, init_method=args.pg_url)
        rpc.init_rpc(
            f"trainer{rank}", rank=rank, world_size=world_size, rpc_backend_options=options
        )
    else:  # the parameter server
        rpc.init_rpc("ps", rank=rank, world_size=world_size, rpc_backend_options=options)
    rpc.shutdown()
    if rank <= 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run_worker, args=(4, parser.parse_args()), nprocs=4, join=True)
