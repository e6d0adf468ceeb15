"""A script's rank that returned normally leaves without native teardown (which could abort it
with SIGABRT after it finished), and loses nothing it wrote."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SCRIPT = """
import atexit, os
out, rank = os.environ["OUT_DIR"], os.environ["RANK"]
f = open(os.path.join(out, "rank" + rank), "w")
f.write("kept\\n")  # never flushed, never closed
atexit.register(lambda: open(os.path.join(out, "atexit" + rank), "w").close())
"""


@pytest.mark.parametrize("launcher", ["spawn", "torchrun"])
def test_unclosed_files_and_atexit_of_a_script_survive_the_fast_exit(tmp_path, launcher):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddptui.cli",
            "--no-ui",
            "--launcher",
            launcher,
            "--script",
            str(script),
            "--run-dir",
            str(tmp_path / "run"),
        ],
        env={**__import__("os").environ, "OUT_DIR": str(out)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        assert (out / f"rank{rank}").read_text() == "kept\n"
        assert (out / f"atexit{rank}").exists()


def test_the_exit_flush_touches_no_deprecated_torch_object():
    """The exit path flushes every open file it finds among the live objects; looking at
    torch.distributed's deprecated ``reduce_op`` that way used to print a FutureWarning at the
    end of every finished rank's log."""
    code = (
        "import torch.distributed, warnings\n"
        "warnings.simplefilter('error')\n"
        "from ddptui.launch.rank_entry import exit_after_success\n"
        "exit_after_success(0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "FutureWarning" not in proc.stderr and "reduce_op" not in proc.stderr
