"""A rank that reports the signal masks of itself and of the processes above it, then checks
that its own SIGTERM handler runs (a script's checkpoint-on-preemption handler).

With ``OUT_DIR`` set it also leaves, in that folder, a file it wrote but never flushed or
closed (``rank<N>``) and registers an atexit handler that makes ``atexit<N>``: the rank's
fast exit must keep both (tests/test_signal_masks.py)."""

import atexit
import os
import signal
import time

if os.environ.get("OUT_DIR"):
    out, rank = os.environ["OUT_DIR"], os.environ["RANK"]
    unclosed = open(os.path.join(out, "rank" + rank), "w")  # noqa: SIM115
    unclosed.write("kept\n")  # never flushed, never closed
    atexit.register(lambda: open(os.path.join(out, "atexit" + rank), "w").close())


def blocked(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigBlk:"):
                    return line.split()[1]
    except OSError:
        pass
    return "?"


got: list[int] = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
chain = [os.getpid()]
for _ in range(3):  # the rank, its parent (torchrun's agent or the driver), and above
    try:
        with open(f"/proc/{chain[-1]}/stat") as stat:
            chain.append(int(stat.read().rsplit(")", 1)[1].split()[1]))
    except (OSError, ValueError, IndexError):
        break
print("SIGBLK", " ".join(f"{pid}={blocked(pid)}" for pid in chain), flush=True)
os.kill(os.getpid(), signal.SIGTERM)
deadline = time.monotonic() + 5
while not got and time.monotonic() < deadline:
    time.sleep(0.01)
print("SIGTERM handled" if got else "SIGTERM not handled", flush=True)
