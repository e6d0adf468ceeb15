"""Where a measured process's CPU goes, from py-spy's samples (``--py-spy`` in ``bench_tui.py``
and ``bench_scale.py``).

py-spy reads the process's memory from outside, so it samples every thread whether or not that
thread holds the GIL, and a thread in C code (a msgspec decode, a ZeroMQ receive, a sleep that
py-spy sees as idle) is seen where it is. A sampler inside the process (``bench_scale.py``'s
``--profile``) can only take a sample when it gets the GIL: it lands where the busy thread
lets the GIL go (a sleep, a poll), and at 256 ranks it put three quarters of the pump thread
at the ``sleep`` in its loop, where py-spy finds the pump decoding and applying events. Idle
threads are left out (py-spy's default), so a thread's samples over the window's ticks are its
share of one core.

``BENCH_PYSPY_RAW=path`` keeps py-spy's raw samples there (one line per stack and its count),
to look closer than the report does (one thread's calls as a tree, say).

py-spy is not a dependency of ddptui: ``uv tool install py-spy`` (it needs the right to trace
the process: root, or ``kernel.yama.ptrace_scope`` 0).
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

#: Samples a second (py-spy's default): 2,000 in a 20 s window, about ±2 % of a core per figure.
RATE = 100
#: ``Function (path/to/file.py:123)`` -> the function and the file's last two parts.
_FRAME = re.compile(r"^(?P<func>.*) \((?:.*/)?(?P<file>[^/]+/[^/]+|[^/]+):(?P<line>\d+)\)$")


def start(pid: int, seconds: float, rate: int = RATE) -> tuple[subprocess.Popen, Path] | None:
    """Record ``pid`` for ``seconds`` in the background (None, with a line said, without py-spy)."""
    exe = shutil.which("py-spy")
    if exe is None:
        print("  --py-spy: py-spy is not on PATH (uv tool install py-spy); no profile")
        return None
    out = Path(tempfile.mkstemp(prefix="bench-pyspy-", suffix=".txt")[1])
    cmd = [exe, "record", "-p", str(pid), "-d", str(max(1, round(seconds))), "-r", str(rate)]
    cmd += ["-f", "raw", "--threads", "--nonblocking", "-o", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return proc, out


def finish(started: tuple[subprocess.Popen, Path] | None, seconds: float, rate: int = RATE) -> str:
    """Wait for the recording and say where the time went ("" without one)."""
    if started is None:
        return ""
    proc, out = started
    try:
        _, err = proc.communicate(timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        err = "py-spy did not end"
    try:
        text = out.read_text()
        if keep := os.environ.get("BENCH_PYSPY_RAW"):  # py-spy's raw samples, for a closer look
            Path(keep).write_text(text)
    finally:
        out.unlink(missing_ok=True)
    if not text.strip():
        why = (err or "").strip().splitlines()
        return "  --py-spy: no samples" + (f" ({why[-1]})" if why else "")
    return report(text, seconds, rate)


def _frame(frame: str) -> tuple[str, str]:
    """(the function with its file, the same with its line) of one py-spy frame."""
    match = _FRAME.match(frame)
    if match is None:
        return frame, frame
    where = f"{match['func']} ({match['file']})"
    return where, f"{match['func']} ({match['file']}:{match['line']})"


def report(raw: str, seconds: float, rate: int = RATE, top: int = 30) -> str:
    """py-spy's raw output (``thread (tid): name;frame;frame… count`` lines, outermost frame
    first) as % of one core: by thread, by the innermost function (its own time, and its
    lines), and by every function on the stack (inclusive)."""
    threads: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    lines: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for row in raw.splitlines():
        stack, _, count = row.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        thread, *frames = stack.split(";")
        name = thread.partition(": ")[2] or thread
        threads[name] += n
        if not frames:
            continue
        parsed = [_frame(f) for f in frames]
        own[f"{name}: {parsed[-1][0]}"] += n
        lines[f"{name}: {parsed[-1][1]}"] += n
        for where in {f"{name}: {p[0]}" for p in parsed}:
            inclusive[where] += n
    ticks = max(1.0, seconds * rate)
    total = sum(threads.values())
    out = [f"  py-spy, {total} samples at {rate}/s over {seconds:g} s, % of one core"]
    for title, counter in (
        ("by thread", threads),
        ("own time, by function", own),
        ("own time, by line", lines),
        ("inclusive", inclusive),
    ):
        out.append(f"  -- {title}")
        out += [f"  {100 * c / ticks:6.2f} %  {k}" for k, c in counter.most_common(top)]
    return "\n".join(out)
