"""A script's rank that returned normally leaves without native teardown (which could abort it
with SIGABRT after it finished), and loses nothing it wrote."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

# A script's unclosed file and atexit surviving the fast exit, under both launchers: checked on
# the signal-probe runs of tests/test_signal_masks.py (one real run per launcher for both).


def test_the_exit_flush_touches_no_deprecated_torch_object():
    """The exit path flushes every open file it finds among the live objects; looking at
    torch.distributed's deprecated ``reduce_op`` that way used to print a FutureWarning at the
    end of every finished rank's log."""
    code = (
        "import torch.distributed, warnings\n"
        "warnings.simplefilter('error')\n"
        "from ddptui.rank.entry import exit_after_success\n"
        "exit_after_success(0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "FutureWarning" not in proc.stderr and "reduce_op" not in proc.stderr
