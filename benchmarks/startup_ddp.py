"""A small plain DDP script for ``bench_startup.py``: no ddptui import, run as torchrun runs it.

Each rank writes ``rank-<RANK>.json`` into ``$STARTUP_OUT``: wall-clock times of the script's
start, torch imported, the process group ready and the first step done, the page faults
(minor: memory mapped and touched) between those last two, its peak RSS
(``ru_maxrss`` at exit: the whole process, so ddptui's rank-side code is counted when it runs
the script), and which heavy modules the process holds at its first step.

Sizes: ``STARTUP_STEPS`` (default 20), batch 32 of 64 features. ``STARTUP_MODELS`` (default
1): models trained one after another, each of ``STARTUP_STEPS`` steps and let go before the next
is made (a fold after a fold), with ``STARTUP_WIDTH`` hidden features (default 128): the peak
RSS then says whether a rank lets each model's memory go, as plain torch does.
"""

import time

T_SCRIPT = time.time()

import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402

TORCH_BEFORE = "torch" in sys.modules

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

T_TORCH = time.time()
#: Modules whose presence in a rank says where its memory and start-up time went.
WATCHED = ("torchvision", "textual", "rich", "psutil", "msgspec", "zmq", "numpy", "ddptui")


def started_at(pid):
    """Wall-clock time process ``pid`` was created (from /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def ancestors(depth=3):
    """This process and its parents: (pid, created at, first words of the command line)."""
    out, pid = [], os.getpid()
    for _ in range(depth + 1):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = [part.decode(errors="replace") for part in f.read().split(b"\0")[:4]]
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        out.append({"pid": pid, "started": started_at(pid), "cmd": " ".join(cmd)})
        if parent <= 1:
            break
        pid = parent
    return out


def main():
    dist.init_process_group("gloo")
    t_group = time.time()
    faults_group = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(rank)
    steps = int(os.environ.get("STARTUP_STEPS", "20"))
    width = int(os.environ.get("STARTUP_WIDTH", "128"))
    t_first = None
    loaded = {}
    for _ in range(int(os.environ.get("STARTUP_MODELS", "1"))):
        model = DistributedDataParallel(
            torch.nn.Sequential(
                torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
            )
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(steps):
            x = torch.randn(32, 64, generator=gen)
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if t_first is None:
                t_first = time.time()
                faults_first = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                loaded = {name: name in sys.modules for name in WATCHED}
                loaded["ddptui_modules"] = sum(m.startswith("ddptui") for m in sys.modules)
        model = opt = loss = None  # let go, as a script that makes the next one does
    dist.destroy_process_group()
    out = os.environ.get("STARTUP_OUT")
    if out:
        record = {
            "rank": rank,
            "pid": os.getpid(),
            "script_start": T_SCRIPT,
            "torch_before_script": TORCH_BEFORE,
            "torch_imported": T_TORCH,
            "group_ready": t_group,
            "first_step": t_first,
            "faults_group_to_first_step": faults_first - faults_group,
            "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "modules": loaded,
            "ancestors": ancestors(),
        }
        with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
            json.dump(record, f)


if __name__ == "__main__":
    main()
