"""The room a rank's script gets on the interpreter's frame stack (ddptui.rank.headroom)."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from ddptui.rank.headroom import with_headroom

#: Calls of the probe's function at each depth.
CALLS = 2000
#: A script that calls a function many times at each depth of its calls and prints the most
#: page faults those calls made at any depth: where the calls cross the end of one of the frame
#: stack's chunks, each call maps a fresh chunk and unmaps it on return. The function's frame
#: (64 locals) is larger than the descent's, so that at the deepest depth whose frame still
#: fits in a chunk, it cannot.
PROBE = (
    f"""
import resource

CALLS = {CALLS}


def leaf():
    """
    + " = ".join(f"v{i}" for i in range(64))
    + """ = None


def at_depth(n):
    if n:
        return at_depth(n - 1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(CALLS):
        leaf()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


print(max(at_depth(n) for n in range(300)))
"""
)


def _worst_faults(tmp_path: Path, through_entry: bool) -> int:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    if through_entry:  # as a rank runs its script
        code = (
            "import sys\nfrom ddptui.rank.entry import run_target\n"
            f"sys.exit(run_target(None, {str(script)!r}, []))"
        )
        cmd = [sys.executable, "-c", code]
    else:  # as ``python probe.py`` runs it
        cmd = [sys.executable, str(script)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPTUI_")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(sys.platform != "linux", reason="counts page faults as Linux does")
def test_a_ranks_script_never_maps_the_frame_stack_anew_at_any_depth(tmp_path: Path) -> None:
    plain = _worst_faults(tmp_path, through_entry=False)
    if plain < CALLS:
        pytest.skip(f"this interpreter keeps its frame stack's chunks ({plain} faults)")
    under_entry = _worst_faults(tmp_path, through_entry=True)
    assert under_entry < CALLS // 10, (plain, under_entry)


def test_headroom_leaves_the_function_as_it_was() -> None:
    def outer(values: list[int]) -> int:
        try:
            return sum(inner(v) for v in values)
        finally:
            values.append(-1)

    def inner(v: int) -> int:
        if v < 0:
            raise ValueError(f"negative {v}")
        return v * 2

    same = with_headroom(outer)
    assert same is outer
    assert outer.__code__.co_stacksize > 64 * 1024 // 8
    values = [1, 2, 3]
    assert outer(values) == 12 and values == [1, 2, 3, -1]
    with pytest.raises(ValueError) as raised:
        outer([-5])
    names = [frame.name for frame in traceback.extract_tb(raised.value.__traceback__)]
    assert names[-3:] == ["outer", "<genexpr>", "inner"]
