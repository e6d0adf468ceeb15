"""A script's rank that returned normally leaves without native teardown (which could abort it
with SIGABRT after it finished), and loses nothing it wrote."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

# A script's unclosed file and atexit surviving the fast exit, under both launchers: checked on
# the signal-probe runs of tests/test_signal_masks.py (one real run per launcher for both).


def test_the_exit_flush_finds_a_frozen_file_and_touches_no_deprecated_torch_object(tmp_path):
    """The exit path flushes every open file it finds among the live objects, those frozen out
    of the collector's view included: here a file opened before torch's import, which the rank
    entry's quiet import freezes (it was lost when the scan skipped frozen objects). Looking at
    torch.distributed's deprecated ``reduce_op`` that way used to print a FutureWarning at the
    end of every finished rank's log."""
    kept = tmp_path / "kept"
    code = (
        f"unflushed = open({str(kept)!r}, 'w')\n"
        "unflushed.write('kept')\n"
        "import gc, warnings\n"
        "from ddptui.rank.quiet_import import import_quietly\n"
        "import_quietly('torch.distributed')\n"
        "assert gc.get_freeze_count() > 0 and not any(o is unflushed for o in gc.get_objects())\n"
        "warnings.simplefilter('error')\n"
        "from ddptui.rank.entry import exit_after_success\n"
        "exit_after_success(0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "FutureWarning" not in proc.stderr and "reduce_op" not in proc.stderr
    assert kept.read_text() == "kept"
