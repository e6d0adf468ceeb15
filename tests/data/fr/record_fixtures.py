"""Record the Flight Recorder fixtures of tests/test_flight.py from real 2-rank gloo runs.

``uv run python tests/data/fr/record_fixtures.py`` rewrites ``<case>/fr-rank-N.json`` for
every case: a small DDP model steps twice, then one rank misbehaves; a thread in each rank
dumps its trace (ddptui.rank.flight_recorder.write_trace) while the main thread is blocked.
"""

import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from ddptui.rank.flight_recorder import write_trace  # noqa: E402

CASES = ("hang", "desync_type", "healthy", "gathered_hang")
#: Functional all_gathers (DTensor's, torchtitan's attention masks) before ``gathered_hang``'s:
#: more than torch's analyzer pairs past when it takes each for a mismatch (its cap, 10).
GATHERS = 12


def load_batch():
    time.sleep(30)


def worker(rank, world, case, port):
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
    for _ in range(2):
        model(torch.randn(4, 8)).sum().backward()
    if case == "gathered_hang":
        import torch.distributed._functional_collectives as funcol

        for _ in range(GATHERS):
            funcol.all_gather_tensor(torch.ones(16, 8, dtype=torch.bool), 0, list(range(world)))
    out = HERE / case
    out.mkdir(exist_ok=True)

    def dump():
        time.sleep(3)
        write_trace(out, rank)
        os._exit(0)

    threading.Thread(target=dump, daemon=True).start()
    if case in ("hang", "gathered_hang"):
        if rank == 1:
            load_batch()
        model(torch.randn(4, 8)).sum().backward()
    elif case == "desync_type":
        if rank == 1:
            dist.broadcast(torch.ones(40), src=0)  # a collective rank 0 never calls
        model(torch.randn(4, 8)).sum().backward()
    dist.barrier()
    time.sleep(30)


if __name__ == "__main__":
    for i, case in enumerate(sys.argv[1:] or CASES):
        mp.spawn(worker, args=(2, case, 29600 + i), nprocs=2, join=True)
