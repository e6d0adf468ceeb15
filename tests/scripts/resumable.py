"""A user's script that resumes the way ddptui's restarts expect (no process group: quick).

Attempt 0: steps 1..5, rank 0 saves ``{"step": 5}`` to ``$DDPTUI_RUN_DIR/checkpoint.pt`` and
exits, then rank 1 exits with code 3. A restarted attempt reads ``DDPTUI_RESUME`` and carries on
from the saved step to step 10.
"""

import os
import sys
import time
from pathlib import Path

import torch

import ddptui

rank = int(os.environ["RANK"])
checkpoint = Path(os.environ["DDPTUI_RUN_DIR"]) / "checkpoint.pt"
resume = os.environ.get("DDPTUI_RESUME")
start = torch.load(resume)["step"] if resume else 0
print(f"attempt {os.environ.get('TORCHELASTIC_RESTART_COUNT')} resume {resume} from {start}")
for step in range(start + 1, 11):
    ddptui.log(step=step, epoch=1, loss=1.0 / step, samples=1)
    if step == 5 and not resume:
        if rank == 0:
            torch.save({"step": step}, str(checkpoint) + ".tmp")
            os.replace(str(checkpoint) + ".tmp", checkpoint)
        else:
            deadline = time.monotonic() + 60
            while not checkpoint.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            sys.exit(3)
        sys.exit(0)  # rank 0 ends well: the attempt fails by rank 1 alone
ddptui.log_eval(epoch=1, accuracy=1.0, resumed_from=start)
