"""A user's script whose rank 1 ends badly after rank 0 has ended well (any world size >= 2).

--how raise: rank 1 raises RuntimeError; --how exit: rank 1 calls sys.exit(3).
No process group: the ranks only report, so the script is quick.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import psutil

import ddptui

parser = argparse.ArgumentParser()
parser.add_argument("--how", choices=["raise", "exit"], required=True)
args = parser.parse_args()

rank = int(os.environ["RANK"])
marker = Path(os.environ["DDPTUI_RUN_DIR"]) / "rank-0.pid"
ddptui.log(epoch=1, loss=1.0, samples=1)
if rank == 0:
    marker.with_suffix(".tmp").write_text(str(os.getpid()))
    marker.with_suffix(".tmp").replace(marker)
    sys.exit(0)


def rank0_gone() -> bool:
    """Rank 0 has exited (its exit handlers, which report it finished, have run)."""
    if not marker.exists():
        return False
    try:
        return psutil.Process(int(marker.read_text())).status() == psutil.STATUS_ZOMBIE
    except (psutil.Error, ValueError):
        return True


deadline = time.monotonic() + 60
while not rank0_gone() and time.monotonic() < deadline:
    time.sleep(0.05)
if rank == 1:
    if args.how == "raise":
        raise RuntimeError(f"boom on rank {rank}")
    sys.exit(3)
