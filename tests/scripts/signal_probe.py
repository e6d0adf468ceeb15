"""A rank that reports the signal masks of itself and of the processes above it, then checks
that its own SIGTERM handler runs (a script's checkpoint-on-preemption handler)."""

import os
import signal
import time


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
