"""Stack capture without ptrace: a real child process dumps its stacks on ddptui's signal."""

import os
import subprocess
import sys
import time

import pytest

from ddptui.constants import RUN_ID_ENV
from ddptui.rank.stacks import capture_stacks
from ddptui.run.diagnosis import classify_stack
from ddptui.runfiles import RunDir

pytestmark = pytest.mark.waits  # mostly waits on timers: run beside real runs (tests/conftest.py)

CHILD = """
import sys, time
from ddptui.rank.stacks import register_stack_dump
register_stack_dump(sys.argv[1], int(sys.argv[2]))

def waiting_for_godot():
    print("ready", flush=True)
    while True:
        time.sleep(0.05)

waiting_for_godot()
"""


@pytest.fixture
def child(tmp_path):
    procs = []

    def start(rank=1, run_id="run-a", register=True):
        code = CHILD if register else CHILD.replace("register_stack_dump(", "(lambda *a: 0)(")
        env = {**os.environ, "PYTHONPATH": os.getcwd(), RUN_ID_ENV: run_id}
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path), str(rank)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def test_capture_reads_each_ranks_stack(child, tmp_path):
    proc = child(rank=1)
    stacks = capture_stacks({1: proc.pid}, tmp_path, timeout=5.0, run_id="run-a")
    assert set(stacks) == {1}
    assert "in waiting_for_godot" in stacks[1]
    info = classify_stack(stacks[1])
    assert not info.in_collective and info.where.startswith("waiting_for_godot (<string>")
    again = capture_stacks({1: proc.pid}, tmp_path, timeout=5.0)
    assert again[1].count("waiting_for_godot") == 1  # only what this capture wrote
    assert proc.poll() is None  # the signal does not end the rank


SERVED = """
import signal, sys, time
from ddptui.rank.flight_recorder import TraceServer
from ddptui.rank.stacks import STACK_SIGNAL, register_stack_dump
register_stack_dump(sys.argv[1], int(sys.argv[2]))
signal.signal(STACK_SIGNAL, signal.SIG_IGN)  # a signal would write nothing here
server = TraceServer(sys.argv[3], sys.argv[1], int(sys.argv[2]))

def waiting_for_godot():
    print("ready", flush=True)
    while True:
        time.sleep(0.05)

waiting_for_godot()
"""


def test_a_rank_with_a_trace_socket_writes_its_stacks_when_asked_not_signalled(tmp_path):
    """The signal's handler reads the other threads' frames without the GIL (a CI run's rank
    ended by SIGSEGV mid-dump); asked over its trace socket, the rank's socket thread writes
    the same dump holding the GIL. This rank ignores the signal: its stacks can only come
    from the socket."""
    from ddptui.rank.flight_recorder import STACKS_REQUEST
    from ddptui.run import flight

    sockets = tmp_path / "fr"
    sockets.mkdir(mode=0o700)
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVED, str(tmp_path), "1", str(sockets)],
        env={**os.environ, "PYTHONPATH": os.getcwd(), RUN_ID_ENV: "run-a"},
        stdout=subprocess.PIPE,
        text=True,
    )
    asked = []

    def ask(ranks):
        asked.append(ranks)
        answers = flight.request_traces(sockets, ranks, 2.0, STACKS_REQUEST)
        return {rank for rank, answer in answers.items() if answer == "ok"}

    try:
        assert proc.stdout.readline().strip() == "ready"
        stacks = capture_stacks({1: proc.pid}, tmp_path, timeout=5.0, run_id="run-a", ask=ask)
        signalled = capture_stacks({1: proc.pid}, tmp_path, timeout=1.0, run_id="run-a")
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert asked == [[1]]
    assert set(stacks) == {1} and "in waiting_for_godot" in stacks[1], stacks
    assert "Current thread" in stacks[1] and "in _serve" in stacks[1]  # the socket's thread
    assert classify_stack(stacks[1]).where.startswith("waiting_for_godot (<string>")
    assert signalled == {}  # ignored: the dump above came over the socket


def test_a_rank_that_does_not_answer_is_signalled(child, tmp_path):
    proc = child(rank=1)
    stacks = capture_stacks({1: proc.pid}, tmp_path, timeout=5.0, ask=lambda ranks: set())
    assert "in waiting_for_godot" in stacks[1]


def test_the_trace_socket_says_when_there_is_no_stacks_file(tmp_path, monkeypatch):
    from ddptui.rank import stacks as stacks_module
    from ddptui.rank.flight_recorder import STACKS_REQUEST, TraceServer
    from ddptui.run import flight

    monkeypatch.setattr(stacks_module, "_dump_file", None)
    sockets = tmp_path / "fr"
    sockets.mkdir(mode=0o700)
    server = TraceServer(str(sockets), str(tmp_path), 0)
    try:
        answers = flight.request_traces(sockets, [0], 2.0, STACKS_REQUEST)
    finally:
        server.close()
    assert answers == {0: "error no stacks file"}


def test_capture_never_signals_a_process_without_the_handler(child, tmp_path):
    proc = child(rank=2, register=False)
    RunDir(tmp_path).stacks(3).touch()
    started = time.monotonic()
    assert capture_stacks({2: proc.pid}, tmp_path, timeout=1.0) == {}
    assert time.monotonic() - started < 1.0  # nobody was asked: no waiting
    time.sleep(0.2)
    assert proc.poll() is None  # SIGUSR2 without a handler would have killed it


def test_capture_only_signals_this_runs_processes(child, tmp_path):
    proc = child(rank=1, run_id="another-run")
    assert capture_stacks({1: proc.pid}, tmp_path, timeout=1.0, run_id="run-a") == {}


def test_capture_skips_dead_and_bogus_pids(tmp_path):
    RunDir(tmp_path).stacks(0).touch()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert capture_stacks({0: dead.pid, 1: -5, 2: 0}, tmp_path, timeout=0.5) == {}


def test_a_project_in_a_folder_named_ddptui_is_the_users_code():
    """A clone of this repository (or any project in a folder called ddptui) holds the user's
    scripts: only ddptui's own package, where it is installed, is library code."""
    from ddptui.rank import frames as frames_module
    from ddptui.run import flight

    script = "/tmp/work/ddptui/tests/scripts/realworld/snapshot_trainer.py"
    assert not frames_module.is_library(script)
    assert frames_module.is_library(frames_module.__file__)  # ddptui itself
    assert frames_module.is_library("/usr/lib/python3.11/threading.py")
    assert frames_module.is_library("<frozen runpy>")
    stack = [
        frames_module.Frame("/usr/lib/python3.11/threading.py", 327, "wait"),
        frames_module.Frame(script, 41, "inject_fault"),
        frames_module.Frame(frames_module.__file__, 10, "run_target"),
    ]
    assert frames_module.classify(stack).where == "inject_fault (snapshot_trainer.py:41)"
    recorded = [{"filename": f.file, "line": f.line} for f in stack]
    assert flight._user_frame(recorded) == "snapshot_trainer.py:41"


SLOW_DUMPER = """
import signal, sys, time
from ddptui.runfiles import RunDir

path = RunDir(sys.argv[1]).stacks(int(sys.argv[2]))
path.touch()
threads = '''Thread 0x00007f08de0146c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

'''
main = '''Current thread 0x00007f09a3c96b80 (most recent call first):
  File "/venv/torch/autograd/graph.py", line 1113 in _engine_run_backward
  File "/venv/torch/_tensor.py", line 623 in backward
  File "/home/me/train.py", line 72 in _run_batch
  File "/home/me/train.py", line 128 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "<frozen runpy>", line 198 in _run_module_as_main
'''

def dump(signum, frame):  # as a rank descheduled between its threads
    with open(path, "a") as f:
        f.write(threads)
    time.sleep(float(sys.argv[3]))
    with open(path, "a") as f:
        f.write(main)

signal.signal(signal.SIGUSR2, dump)
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


@pytest.mark.parametrize("pause", [0.4])
def test_a_dump_cut_by_a_pause_is_read_whole(tmp_path, pause):
    """A rank that stalls between its other threads and its main thread (faulthandler lists
    the main thread last) is read to its main thread's outermost frame: cut off, its wait in
    the gradient all-reduce read as a hang outside any collective."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_DUMPER, str(tmp_path), "0", str(pause)],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        stacks = capture_stacks({0: proc.pid}, tmp_path, timeout=5.0)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert stacks[0].endswith("in _run_module_as_main\n"), stacks
    info = classify_stack(stacks[0])
    assert info.in_collective and info.where == "_run_batch (train.py:72)", info


def test_whole_dump_ends_with_the_main_threads_outermost_frame():
    from ddptui.rank.stacks import whole_dump

    frame = '  File "/x/threading.py", line 1002 in _bootstrap\n'
    assert not whole_dump("")
    assert not whole_dump("Thread 0x1 (most recent call first):\n" + frame)
    assert not whole_dump('  File "/home/me/train.py", line 128 in <module>')  # line unfinished
    assert whole_dump('  File "/home/me/train.py", line 128 in <module>\n')
    assert whole_dump('  File "<string>", line 1 in <module>\n')  # mp.spawn's child
    assert whole_dump('  File "<frozen runpy>", line 198 in _run_module_as_main\n')
    assert whole_dump(frame + "  ...\n")  # over faulthandler's 100 frames


def test_a_dump_over_the_size_kept_keeps_its_end_where_the_main_thread_is(tmp_path):
    """faulthandler writes the main thread last: of a dump with dozens of threads, what is
    kept is its end, from a thread's first line."""
    from ddptui.rank.stacks import MAX_STACK_BYTES, _read_from, whole_dump

    helper = "Thread 0x00007f{:010x} (most recent call first):\n" + (
        '  File "/usr/lib/python3.11/threading.py", line 331 in wait\n' * 30
    )
    main = (
        "Current thread 0x00007f09a3c96b80 (most recent call first):\n"
        '  File "/venv/torch/autograd/graph.py", line 1113 in _engine_run_backward\n'
        '  File "/home/me/train.py", line 128 in <module>\n'
    )
    path = tmp_path / "stacks-rank-0.txt"
    path.write_text("old dump\n" + "\n".join(helper.format(i) for i in range(60)) + "\n" + main)
    assert path.stat().st_size > MAX_STACK_BYTES
    text = _read_from(path, len("old dump\n"))
    assert len(text.encode()) <= MAX_STACK_BYTES
    assert text.startswith("Thread 0x") and text.endswith(main) and whole_dump(text)
    assert classify_stack(text).in_collective


def test_a_dump_names_the_thread_that_trains_and_is_read_from_it(tmp_path, monkeypatch):
    """A rank that trains in another thread than its main one (a loop in a thread, an RPC
    thread) names it before its dump (over the trace socket: the dump this rank writes
    itself), and the dump is read from it: where it waits, not where the main thread joins."""
    import faulthandler
    import threading

    from ddptui.rank import heartbeat, stacks

    go, stop = threading.Event(), threading.Event()

    def waiting_in_its_loop():
        go.set()
        stop.wait(10)

    trainer = threading.Thread(target=waiting_in_its_loop)
    trainer.start()
    go.wait(5)
    monkeypatch.setattr(stacks, "_dump_file", None)
    monkeypatch.setattr(heartbeat, "_thread_source", lambda: trainer.ident)
    path = stacks.register_stack_dump(tmp_path, 0)
    try:
        assert stacks.dump_now()
    finally:
        stop.set()
        trainer.join(5)
        faulthandler.unregister(stacks.STACK_SIGNAL)
        stacks._dump_file.close()
    text = path.read_text()
    assert text.startswith(f"{stacks.STEPS_THREAD_MARK}0x{trainer.ident:016x}\n")
    assert classify_stack(text).where.startswith("waiting_in_its_loop (test_stacks.py:")
