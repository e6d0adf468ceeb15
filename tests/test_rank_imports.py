"""What a rank of the built-in synthetic trainer imports: never torchvision (≈180 MiB and
seconds per rank on a busy machine, for image datasets and models it does not use) and never
the dashboard. In a fresh interpreter, as a rank starts."""

from __future__ import annotations

import json
import subprocess
import sys

RANK = """
import json, sys
import ddptui.launch.rank_entry
from trainers import synthetic
from trainers.options import parse_config
config = parse_config(synthetic.build_arg_parser(), ["--epochs", "1"])
data = synthetic.build_data(config, None, None)
synthetic.build_model(config, data.num_classes)
print(json.dumps(sorted(m for m in ("torchvision", "textual", "rich") if m in sys.modules)))
"""


def test_the_synthetic_trainer_imports_neither_torchvision_nor_the_dashboard():
    done = subprocess.run(
        [sys.executable, "-c", RANK], capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
