"""The rank package is light: every module of ``ddptui.rank`` imports without torch, numpy,
Textual or ZeroMQ (they load when a rank uses them). The import-linter contracts in
pyproject.toml check the layering statically; this is the runtime half they cannot see."""

import os
import subprocess
import sys

CODE = """
import pkgutil, importlib, sys
import ddptui.rank
names = [m.name for m in pkgutil.iter_modules(ddptui.rank.__path__, "ddptui.rank.")]
for name in names:
    importlib.import_module(name)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy", "textual", "zmq"))
print(len(names), heavy)
"""


def test_every_rank_module_imports_without_heavy_dependencies():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    count, heavy = out.stdout.split(" ", 1)
    assert int(count) >= 7  # entry, reporter, pending, instrument, stacks, cpus, net
    assert heavy.strip() == "[]"


SCRIPT = """
import torch
print("threads", torch.get_num_threads())
"""


def test_a_rank_script_gets_the_ranks_share_of_the_cores(tmp_path):
    """Whatever OMP_NUM_THREADS said before, the script's torch runs the rank's share."""
    from ddptui.rank.cpus import threads_per_rank

    script = tmp_path / "threads.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPTUI_")}
    env.update(RANK="0", LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="7")
    cmd = [sys.executable, "-m", "ddptui.rank.entry", "--script", str(script)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"threads {threads_per_rank(2)}" in out.stdout
