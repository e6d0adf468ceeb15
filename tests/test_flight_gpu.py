"""The Flight Recorder's NCCL path on a real GPU (marked ``gpu``; skipped without CUDA).

With one GPU, NCCL cannot run two ranks (it refuses two ranks on one device), so it cannot
desync across ranks here: this checks what one GPU can, that a rank's NCCL collectives are
recorded, dumped by ddptui (with stacks) and read back by torch's analyzer, and that the
heartbeat's progress names NCCL's group. Desync and hang verdicts across NCCL ranks need two
GPUs; the matching itself is the same code as gloo's (torch's analyzer), tested on gloo."""

import json
import os
import subprocess
import sys

import pytest

from ddptui.run import flight
from tests.helpers import ROOT

pytestmark = pytest.mark.gpu

PROBE = """
import json, os
import torch, torch.distributed as dist
os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
from ddptui.rank import flight_recorder
torch.cuda.set_device(0)
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
for _ in range(3):
    t = torch.ones(1024, device="cuda")
    dist.all_reduce(t)
torch.cuda.synchronize()
marks = flight_recorder.progress()
doc = flight_recorder.dump_trace(0)
print(json.dumps({"marks": marks, "doc": doc}))
dist.destroy_process_group()
"""


def test_nccl_collectives_are_recorded_dumped_and_read_by_torchs_analyzer(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    doc = got["doc"]
    assert "nccl" in doc["backends"], doc["backends"]
    reduces = [e for e in doc["entries"] if e["profiling_name"].endswith(":all_reduce")]
    assert len(reduces) == 3 and reduces[-1]["input_sizes"] == [[1024]]
    assert got["marks"] and got["marks"][-1]["started"] >= 3
    (tmp_path / "fr-rank-0.json").write_text(json.dumps(doc))
    traces, missing = flight.load_traces(tmp_path, [0])
    assert missing == {}
    found, why = flight.explain(traces, 1)
    assert found == [] and why is None  # one rank: everything matches itself
