"""Workers a script starts with ``multiprocessing.Process`` (ddptui.rank.spawned): which
processes are followed, what a worker reports at its end, and the starting process going
quiet once a worker has its process group. In one process, no worker started; the real runs
are in the real-world tier (``process_workers``, ``process_workers_spawn``)."""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.pool
import os
import sys
import threading

import pytest

from ddptui.constants import ENDPOINT_ENV
from ddptui.rank import heartbeat, reporter, spawned


def _script_target(value):
    return value * 2


def _install():
    return None


@pytest.fixture
def parent(monkeypatch):
    """A rank process ddptui launched, before it starts any process of the script's."""
    monkeypatch.setenv(ENDPOINT_ENV, "ipc:///nonexistent")
    monkeypatch.setattr(spawned, "_formed_events", {})
    monkeypatch.setattr(spawned, "_formed_event", None)
    monkeypatch.setattr(spawned, "_group_seen", False)
    monkeypatch.setattr(heartbeat, "_quiet", None)
    monkeypatch.setattr(heartbeat, "_then", None)
    for name in (spawned.SPAWNED_ENV, spawned.AGENT_STORE_ENV, spawned.AGENT_ENDPOINT_ENV):
        monkeypatch.delenv(name, raising=False)


def test_a_process_running_a_function_of_the_script_is_followed(parent):
    process = multiprocessing.get_context("spawn").Process(target=_script_target, args=(4,))
    spawned.wrap_process(process, _install)
    target = process._target
    assert isinstance(target, functools.partial) and target.func is spawned.process_worker
    assert target.args[:2] == (_script_target, _install)
    assert set(spawned._formed_events) == {"spawn"}  # its own start method's event
    assert heartbeat._quiet is spawned.workers_formed
    assert heartbeat._then is spawned.workers_took_over  # its last word, then its trace server
    spawned.wrap_process(process, _install)  # started again: not wrapped twice
    assert process._target is target


class _Worker(multiprocessing.Process):
    """A rank written as a Process subclass: its work in ``run()``, no target."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def run(self):
        return _script_target(self.value)


def test_a_process_subclass_that_overrides_run_is_followed(parent, monkeypatch):
    import pickle

    process = _Worker(4)
    spawned.wrap_process(process, _install)
    wrapped = process.__dict__["run"]
    assert isinstance(wrapped, spawned.SubclassRun) and wrapped.install is _install
    assert process._target is None and heartbeat._quiet is spawned.workers_formed
    spawned.wrap_process(process, _install)  # started again: not wrapped twice
    assert process.__dict__["run"] is wrapped
    # in the worker (a spawned one unpickles its process first): the class's run, wrapped
    # (the event pickles only while a process is spawned)
    again = pickle.loads(pickle.dumps(spawned.SubclassRun(_install, None)))
    ran = []
    monkeypatch.setattr(multiprocessing, "current_process", lambda: process)
    monkeypatch.setattr(spawned, "process_worker", lambda own, install, formed: ran.append(own()))
    again()
    assert ran == [8]


def test_the_librarys_processes_and_runs_without_ddptui_are_left_alone(parent, monkeypatch):
    from torch.utils.data._utils.worker import _worker_loop

    for target in (_worker_loop, multiprocessing.pool.worker, None):
        process = multiprocessing.Process(target=target)
        spawned.wrap_process(process, _install)
        assert process._target is target and "run" not in process.__dict__
    # a subclass of the library's own (a Pool's, a Manager's server): its run left alone
    process = multiprocessing.context.ForkServerProcess()
    spawned.wrap_process(process, _install)
    assert "run" not in process.__dict__
    monkeypatch.delenv(ENDPOINT_ENV)
    process = multiprocessing.Process(target=_script_target)
    spawned.wrap_process(process, _install)
    assert process._target is _script_target
    process = _Worker(1)
    spawned.wrap_process(process, _install)
    assert "run" not in process.__dict__
    assert spawned._formed_events == {} and heartbeat._quiet is None


class _Reporter:
    def __init__(self):
        self.calls = []

    def finished(self, error=None, traceback=None):
        self.calls.append(("finished", error, traceback))

    def close(self):
        self.calls.append(("close",))


@pytest.fixture
def sent(parent, monkeypatch):
    """What a worker's reporter is asked to send at its end."""
    rep = _Reporter()
    monkeypatch.setattr(reporter, "get_reporter", lambda: rep)
    return rep.calls


def test_a_helper_that_forms_no_group_reports_nothing(sent):
    """A forked helper of a rank that formed its group inherits that rank's state: it must
    not end the rank (a finished status under its rank, with the helper's pid)."""
    spawned._group_seen = True  # the parent's, copied into the forked helper
    event = threading.Event()
    assert spawned.process_worker(_script_target, _install, event, 21) == 42
    assert sent == []
    assert not event.is_set()


def _forms_group_and(then):
    def target():
        spawned._group_seen = True  # as on_process_group marks it
        then()

    return target


def test_a_worker_that_formed_its_group_reports_how_it_ended(sent):
    def boom():
        raise RuntimeError("boom on rank 1")

    with pytest.raises(RuntimeError):
        spawned.process_worker(_forms_group_and(boom), _install, None)
    (call, error, trace), close = sent
    assert (call, error, close) == ("finished", "RuntimeError: boom on rank 1", ("close",))
    assert "boom on rank 1" in trace and "Traceback" in trace

    sent.clear()
    spawned.process_worker(_forms_group_and(lambda: None), _install, None)
    assert sent == [("finished", None, None), ("close",)]


@pytest.mark.parametrize(("code", "error"), [(0, None), (None, None), (3, "SystemExit: 3")])
def test_a_worker_that_exits_reports_its_code(sent, code, error):
    def leave():
        raise SystemExit(code)

    with pytest.raises(SystemExit):
        spawned.process_worker(_forms_group_and(leave), _install, None)
    assert sent[0][:2] == ("finished", error)


def test_a_worker_forgets_its_parents_workers_and_meets_where_the_script_says(parent, monkeypatch):
    """A forked worker has its parent's events and quiet check: its own beats must not stop
    when a sibling forms the group. torchrun's agent-store flag is not its (see
    spawned_worker)."""
    spawned._formed_events["fork"] = threading.Event()
    heartbeat.quiet_when(spawned.workers_formed)
    monkeypatch.setenv(spawned.AGENT_STORE_ENV, "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    seen = {}

    def target():
        seen["store"] = os.environ.get(spawned.AGENT_STORE_ENV)
        seen["spawned"] = os.environ.get(spawned.SPAWNED_ENV)

    spawned.process_worker(target, _install, None)
    assert spawned._formed_events == {} and heartbeat._quiet is None
    assert seen == {"store": None, "spawned": "1"}


class _Beats:
    def __init__(self):
        self.beats = 0
        self.muted = threading.Event()

    def beat(self, **fields):
        self.beats += 1

    def mute(self):
        self.muted.set()


def test_the_starting_process_goes_quiet_once_a_worker_formed_its_group(parent):
    formed = threading.Event()
    spawned._formed_events["fork"] = formed
    stood_down = []
    heartbeat.quiet_when(spawned.workers_formed, then=lambda: stood_down.append(True))
    rep = _Beats()
    beat = heartbeat.Heartbeat(rep, interval=0.05).start()
    try:
        assert not rep.muted.wait(0.3)  # it beats while its workers prepare
        assert rep.beats > 0
        formed.set()  # on_process_group in a worker
        assert rep.muted.wait(5)
        beat._thread.join(5)
        assert not beat._thread.is_alive()
        assert stood_down == [True]
    finally:
        beat.stop()
    count = rep.beats
    beat.last()  # stopped: no last beat from it at exit
    assert rep.beats == count


class _Ending:
    """A reporter at its process's end: what it sends, and whether it was muted first."""

    def __init__(self):
        self.enabled, self.muted, self.sent = True, False, []

    def mute(self):
        self.muted = True

    def finished(self, error=None, traceback=None):
        if not self.muted:
            self.sent.append("finished")

    def close(self):
        self.sent.append("close")


@pytest.mark.parametrize("formed", [True, False])
def test_the_starting_process_ending_within_a_beat_of_its_workers_forming_ends_unheard(
    parent, monkeypatch, formed
):
    """The tutorial's ``train_dist.py`` without its data: both workers formed their group and
    failed at once, and the process that started them ended before its heartbeat looked. Its
    ``finished`` went out as rank 0 and hid the failure of the worker that was rank 0. At its
    end it stands down as its heartbeat would have; before its workers form, it ends heard."""
    spawned._formed_events["fork"] = event = threading.Event()
    if formed:
        event.set()
    stood_down = []
    heartbeat.quiet_when(spawned.workers_formed, then=lambda: stood_down.append(True))
    rep = _Ending()
    monkeypatch.setattr(heartbeat, "_beat", None)
    monkeypatch.setattr(reporter, "_reporter", rep)
    reporter._at_exit(rep)
    assert rep.sent == (["close"] if formed else ["finished", "close"])
    assert stood_down == ([True] if formed else [])


class _Noting:
    """A reporter that keeps its notes, and refuses them once muted."""

    def __init__(self):
        self.muted, self.notes = False, []

    def note(self, code, announce=True, **numbers):
        assert not announce  # no status of its own: its workers have its rank now
        if not self.muted:
            self.notes.append((code, numbers))

    def mute(self):
        self.muted = True


def test_the_starting_process_says_how_many_ranks_its_workers_formed_as_it_goes_quiet(
    parent, monkeypatch
):
    """ijepa's ``main.py`` launched as 2 copies: each copy's ``Process`` per device formed (or
    failed to form) a group of 2; the copy whose workers formed says so, with the group's
    size, before its reporter goes quiet: the spawners diagnosis and a failure's hint name
    it. Its flag is shared memory its workers write the group's size into."""
    rep = _Noting()
    monkeypatch.setattr(reporter, "get_reporter", lambda: rep)
    monkeypatch.setattr(spawned, "stand_down", lambda: rep.notes.append(("stood down", {})))
    flag = spawned._formed_events["fork"] = spawned.FormedFlag(multiprocessing.get_context("fork"))
    assert not spawned.workers_formed()
    flag.set(2)  # on_process_group in a worker of a group of 2
    assert spawned.workers_formed() and flag.world_size() == 2
    heartbeat.quiet_when(spawned.workers_formed, then=spawned.workers_took_over)
    heartbeat._go_quiet(None, rep)
    assert rep.notes == [("workers_formed", {"workers": 2}), ("stood down", {})]
    assert rep.muted


def test_a_rank_with_a_group_of_its_own_never_goes_quiet_for_its_workers(parent):
    spawned._formed_events["fork"] = formed = threading.Event()
    formed.set()
    assert spawned.workers_formed()
    spawned._group_seen = True  # this process trains in a group of its own
    assert not spawned.workers_formed()


def _exit_with_the_heartbeat_forgotten():
    os._exit(0 if heartbeat._beat is None else 1)


def test_a_forked_worker_starts_a_heartbeat_of_its_own(monkeypatch):
    """The parent's heartbeat thread does not run in a forked child: a child that kept the
    parent's object would never start its own, and its rank would send no beats (a forked
    mp.spawn worker's too), leaving a hang in it without evidence."""
    monkeypatch.setattr(heartbeat, "_beat", object())
    process = multiprocessing.get_context("fork").Process(target=_exit_with_the_heartbeat_forgotten)
    process.start()
    process.join(30)
    assert process.exitcode == 0


class _Torch:
    def __init__(self):
        self.threads = []

    def set_num_threads(self, n):
        self.threads.append(n)


def test_a_worker_takes_its_share_of_the_ranks_threads(parent, monkeypatch):
    """Forked from a rank whose torch had set its threads, two workers of the rank's whole
    share each took 4 times the CPU of ``python train_dist.py``: each takes its share once
    its group says how many share them."""
    from ddptui.constants import THREADS_ENV

    torch = _Torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setenv(THREADS_ENV, "4")
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    spawned._share_threads_among(2)
    assert torch.threads == [2]
    assert os.environ["OMP_NUM_THREADS"] == os.environ[THREADS_ENV] == "2"
    spawned._share_threads_among(8)  # never below one thread
    assert torch.threads == [2, 1]
