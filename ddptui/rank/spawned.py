"""Ranks a script starts itself: ``torch.multiprocessing.spawn`` workers (one process per GPU,
the shape of many public DDP scripts, and of the one-process-per-node Slurm scripts that
spawn their workers and read ``SLURM_*``). Runs inside training processes; stdlib only.

ddptui starts the script's process (the *spawner*); the spawner starts the real ranks. The
instrumentation wraps ``start_processes`` so that each worker runs :func:`spawned_worker`
first: it installs the same hooks as the rank entry does, and the worker's rank and world
size are learned from the process group it creates (``init_process_group`` is wrapped), so
the workers are the run's ranks. The spawner itself goes quiet once it has spawned: it only
waits, and is never judged (no heartbeat, no status of its own; the launcher still sees how
it exits).

Workers a script starts with ``multiprocessing.Process`` (PyTorch's "Writing Distributed
Applications" tutorial: a ``Process`` per rank whose target calls ``init_process_group``)
run :func:`process_worker` first in the same way (:func:`wrap_process`). Nothing says in
advance that such a process is a rank (a script starts helpers the same way), so the process
that started it goes quiet only once one of its workers has formed a process group
(:func:`workers_formed`, read by its heartbeat), and a worker that never forms one reports
nothing.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from ddptui.constants import ENDPOINT_ENV, RUN_DIR_ENV, SPAWNED_ENV, THREADS_ENV
from ddptui.rank import world

#: torchrun's "use the agent's TCPStore" flag for its own workers (torch.distributed.run).
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
#: In a spawned worker whose parent torchrun told to use the agent's store: where that store
#: is (``MASTER_ADDR:MASTER_PORT`` as torchrun gave them to its rank, :data:`TORCHRUN_STORE_ENV`).
AGENT_ENDPOINT_ENV = "DDPTUI_AGENT_STORE"
#: In a torchrun rank (and the workers it starts): torchrun's ``MASTER_ADDR:MASTER_PORT``, as
#: the rank got them before its script ran (see :func:`note_agent_store`).
TORCHRUN_STORE_ENV = "DDPTUI_TORCHRUN_STORE"

#: Whether this process has seen its process group (and announced its rank when spawned).
_group_seen = False
#: Where targets of ``multiprocessing.Process`` are the library's own (a DataLoader's workers,
#: a Pool's, a Manager's server, mp.spawn's wrapper): never a rank, left as they are.
LIBRARY_TARGETS = frozenset({"multiprocessing", "concurrent", "torch", "ddptui"})
#: In a process that started workers with ``multiprocessing.Process``: per start method, the
#: flag they set once one of them has its process group (see :func:`workers_formed`).
_formed_events: dict[str, Any] = {}
#: In such a worker: the flag it sets once its process group has formed.
_formed_event: Any = None
#: Whether this process is such a worker (see :func:`process_worker`).
_process_worker = False


def spawned_worker(
    fn: Callable[..., Any], install: Callable[[], Any], index: int, *args: Any
) -> Any:
    """What a spawned worker runs instead of ``fn(index, *args)``: the hooks (``install``,
    the instrumentation's), then ``fn``."""
    _become_worker()
    # its index among the workers of this node: the local rank (the GPU) in these scripts
    os.environ["LOCAL_RANK"] = str(index)
    # A worker forked from the spawner has the spawner's torch threads: its share instead
    # (see share_threads; a spawned one read it from OMP_NUM_THREADS when it imported torch).
    _take_thread_share()
    from ddptui.rank.reporter import get_reporter  # loaded on use: keeps this module light

    # The reporter first (its exit handler then runs last, after the hooks flushed the last
    # step); it sends nothing until the worker's process group names its rank.
    get_reporter()
    inst = install()
    result = _reporting_failure(inst, fn, index, *args)
    # A forked worker (``start_processes(..., start_method="fork")``, as facebookresearch/pycls
    # starts them) ends in ``os._exit``, where no exit handler runs: its last steps, its last
    # epoch and its end are sent here, as a Process worker's are (the exit handlers then find
    # them sent). A forked worker's last steps, last epoch and end were never sent.
    _worker_ended(inst)
    return result


def _become_worker() -> None:
    """What every worker a script started does first: it is one (its rank comes from its
    process group), and torchrun's agent-store flag is not its own.

    Under ddptui's torchrun (the vehicle of a one-process spawner), torchrun tells its worker
    to use the agent's store: inherited, it would make these workers' env:// rendezvous
    (MASTER_ADDR/PORT the script sets, as pytorch/examples' multigpu.py does) connect as
    clients to a store nobody serves, and wait 30 minutes. The script's own workers are not
    torchrun's: they rendezvous as under ``python script.py``, unless they meet at the
    agent's own endpoint (see :func:`before_rendezvous`)."""
    os.environ[SPAWNED_ENV] = "1"
    from ddptui.rank import reporter  # loaded on use: keeps this module light

    reporter.unheard_at_exit(unranked)
    if os.environ.pop(AGENT_STORE_ENV, None) == "True":
        os.environ[AGENT_ENDPOINT_ENV] = os.environ.get(TORCHRUN_STORE_ENV) or _endpoint()


def note_agent_store() -> None:
    """In a torchrun rank, before its script runs: where torchrun's agent store is, for the
    workers the script may start (:func:`_become_worker`). Their inherited ``MASTER_ADDR`` and
    ``MASTER_PORT`` are the script's once it sets its own before it spawns them
    (yangkky/distributed_tutorial's ``mnist-distributed.py``: ``127.0.0.1:8888``, then
    ``mp.spawn``): read there, the script's endpoint passed for the agent's, the workers
    went back to the agent-store flag, and waited as clients of a store nobody served at
    8888 (``spawned 2 workers, waiting for their process group``, 6 min, until stopped)."""
    if os.environ.get(AGENT_STORE_ENV) == "True":  # whatever the environment said before
        os.environ[TORCHRUN_STORE_ENV] = _endpoint()


def _take_thread_share() -> None:
    """torch in this worker takes the threads :func:`share_threads` left it (``DDPTUI_THREADS``),
    where ddptui chose the rank's threads and torch is loaded."""
    torch = sys.modules.get("torch")
    if torch is not None and THREADS_ENV in os.environ:
        from ddptui.rank.cpus import threads_per_rank

        torch.set_num_threads(threads_per_rank(1))


def wrap_process(process: Any, install: Callable[[], Any]) -> None:
    """Before ``process.start()``: a process whose target is the script's (not the library's)
    runs :func:`process_worker` first, with the flag it sets once its process group forms.
    So does one of a ``Process`` subclass of the script's that overrides ``run`` (``class
    Worker(mp.Process): def run(self): ...``, no target): its ``run`` is wrapped in the same
    way (:class:`SubclassRun`)."""
    if not os.environ.get(ENDPOINT_ENV):
        return
    target = getattr(process, "_target", None)
    if target is None:
        if not _scripts_run(process):
            return
    elif not callable(target):
        return
    elif isinstance(target, functools.partial) and target.func in (process_worker, spawned_worker):
        return
    elif (getattr(target, "__module__", None) or "").partition(".")[0] in LIBRARY_TARGETS:
        return
    import multiprocessing  # loaded by the caller (Process.start)

    # A flag of the process's own start method (its memory reaches a worker as that method
    # passes it: inherited by a fork, its file descriptor handed to a spawned interpreter).
    method = getattr(process, "_start_method", None) or multiprocessing.get_start_method()
    flag = _formed_events.get(method)
    if flag is None:
        flag = _formed_events[method] = FormedFlag(multiprocessing.get_context(method))
        from ddptui.rank import heartbeat

        heartbeat.quiet_when(workers_formed, then=workers_took_over)
    if target is None:
        process.run = SubclassRun(install, flag)  # an instance's attribute: pickled with it
    else:
        process._target = functools.partial(process_worker, target, install, flag)


def _scripts_run(process: Any) -> bool:
    """Whether ``process`` is of a class whose ``run`` is its own and not the library's (see
    :data:`LIBRARY_TARGETS`: a ``Pool``'s or a ``Manager``'s processes), not yet wrapped."""
    if isinstance(process.__dict__.get("run"), SubclassRun):
        return False  # started again: not wrapped twice
    import multiprocessing.process  # loaded by the caller (Process.start)

    cls = type(process)
    run = getattr(cls, "run", None)
    if run is None or run is multiprocessing.process.BaseProcess.run:
        return False
    module = getattr(run, "__module__", None) or ""
    return callable(run) and module.partition(".")[0] not in LIBRARY_TARGETS


class FormedFlag:
    """What a worker sets once its process group has formed, for the process that started it:
    one integer of shared memory, the group's size (``is_set``/``set``, as an event's).

    Not a ``multiprocessing`` event: a spawn context's event is a named semaphore that a spawned
    worker opens by name when it unpickles its process, a second or more after ``start()``,
    and a script that starts its workers and ends its main module without joining them
    (facebookresearch/ijepa's ``main.py``) is at its exit by then, where multiprocessing's exit
    handler unlinks such names before it joins the children. Unpickling the event then raised
    in the worker before any of the script's code ran (``FileNotFoundError`` in
    ``SemLock._rebuild``): the script's ranks died where plain Python runs them. Shared memory
    has no name to lose: a spawned worker gets its file descriptor at its start."""

    def __init__(self, context: Any) -> None:
        self.value = context.RawValue("i", 0)

    def set(self, world_size: int = 1) -> None:
        """Formed, in a group of ``world_size`` ranks."""
        self.value.value = max(1, min(int(world_size), 2**31 - 1))

    def is_set(self) -> bool:
        return bool(self.value.value)

    def world_size(self) -> int:
        return int(self.value.value)


class SubclassRun:
    """What a worker of a script's ``Process`` subclass runs instead of its ``run``:
    :func:`process_worker` around the class's own ``run``. It holds no reference to the
    process (a spawned worker unpickles its process before running it): in the worker, the
    process is ``multiprocessing.current_process()``."""

    def __init__(self, install: Callable[[], Any], formed: Any) -> None:
        self.install, self.formed = install, formed

    def __call__(self) -> Any:
        import multiprocessing

        process = multiprocessing.current_process()
        own = functools.partial(type(process).run, process)
        return process_worker(own, self.install, self.formed)


def process_worker(
    target: Callable[..., Any], install: Callable[[], Any], formed: Any, *args: Any, **kwargs: Any
) -> Any:
    """What a worker started with ``multiprocessing.Process`` runs instead of its target: as
    :func:`spawned_worker`, the hooks first (a forked worker has its parent's already), its
    rank learned from the process group it forms. Its end is reported here, once it has a
    rank: a forked worker ends in ``os._exit``, where no exit handler runs."""
    global _formed_event, _group_seen, _process_worker
    _formed_event, _process_worker = formed, True
    _group_seen = False  # a forked worker's copy of its parent's: this process has none yet
    if _formed_events:  # a forked worker's copy of its parent's: its own workers only
        _formed_events.clear()
        from ddptui.rank import heartbeat

        heartbeat.quiet_when(None)
    _become_worker()
    inst = install()  # the Instrument (a forked worker's: its parent's, installed already)
    result = _reporting_failure(inst, target, *args, **kwargs)
    _worker_ended(inst)
    return result


def _reporting_failure(inst: Any, target: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``target(*args, **kwargs)`` in a worker the script started; when it raises, the worker
    (once a rank) reports its own failure, with its error and traceback, before the exception
    goes on. mp.spawn's wrapper catches it (the spawner raises it again, "Process 1 terminated
    with the following error") and exits the worker with code 1 through ``sys.exit``, where no
    exception reaches the exit handlers: a worker that raised ended ``finished``, and the
    spawner's exit code, launched as rank 0, named rank 0 as the run's failure."""
    try:
        return target(*args, **kwargs)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            detail = exc.code if isinstance(exc.code, str) else f"SystemExit: {exc.code}"
            _worker_ended(inst, detail, _traceback(exc))
        else:
            _worker_ended(inst)
        raise
    except BaseException as exc:
        _worker_ended(inst, f"{type(exc).__name__}: {exc}", _traceback(exc))
        raise


def _traceback(exc: BaseException) -> str:
    """``exc``'s traceback from the script's own frames on (this module's call left out)."""
    tb = exc.__traceback__
    return "".join(traceback.format_exception(type(exc), exc, tb.tb_next if tb else None))


def _worker_ended(inst: Any, error: str | None = None, trace: str | None = None) -> None:
    """A :func:`process_worker` that formed a process group ended: what the exit handlers do
    at a rank's exit (the last beat, the last steps, the final status), in their order."""
    if not _group_seen or not os.environ.get(ENDPOINT_ENV):
        return
    from ddptui.rank import heartbeat
    from ddptui.rank.reporter import get_reporter

    try:
        heartbeat.last()
        if inst is not None:
            inst.at_exit()
        reporter = get_reporter()
        reporter.finished(error=error, traceback=trace)
        reporter.close()
    except Exception:  # telemetry never changes how a worker ends
        pass


def workers_took_over() -> None:
    """This process goes quiet: its workers formed their group (:func:`workers_formed`).
    It says so once (a ``workers_formed`` note, the group's size: a launched copy that starts
    a whole set of ranks itself, one of several on a node, is what the spawners diagnosis and
    the crash's hint speak of), then stands down."""
    try:
        from ddptui import protocol
        from ddptui.rank.reporter import get_reporter

        sizes = [flag.world_size() for flag in _formed_events.values() if flag.is_set()]
        workers = max(sizes, default=0)
        if 1 <= workers <= protocol.MAX_GROWN_WORLD:
            get_reporter().note("workers_formed", announce=False, workers=workers)
    except Exception:  # telemetry never changes how a process runs
        pass
    stand_down()


def workers_formed() -> bool:
    """Whether a worker this process started with ``multiprocessing.Process`` has formed its
    process group: it is a rank now, and this process only waits for it (unless this process
    has a group of its own: a rank that trains goes on reporting whatever its helpers do)."""
    return not _group_seen and any(flag.is_set() for flag in _formed_events.values())


def _endpoint() -> str:
    return f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"


def before_rendezvous() -> None:
    """In a spawned worker, just before its process group forms: torchrun's agent-store flag
    back when the worker meets at the agent's own endpoint (PyTorch Lightning's ``ddp_spawn``
    keeps torchrun's ``MASTER_ADDR``/``MASTER_PORT``: without the flag its rank 0 tried to
    serve a store there and failed, "address already in use", where plain torchrun works),
    and away when the script set another (pytorch/examples' ``multigpu.py``, which would wait
    as a client of a store nobody serves). Reached when the script calls
    ``torch.distributed.init_process_group`` through the module; a script that bound it by
    name before the hooks were in keeps the flag away, as under ``python script.py``."""
    agent = os.environ.get(AGENT_ENDPOINT_ENV)
    if agent is None:
        return
    if agent == _endpoint():
        os.environ[AGENT_STORE_ENV] = "True"
    else:
        os.environ.pop(AGENT_STORE_ENV, None)


def wrap_target(fn: Callable[..., Any], install: Callable[[], Any]) -> Callable[..., Any]:
    """``fn`` as the workers should run it, installing the hooks with ``install`` first
    (picklable when ``fn`` is, as spawn needs: ``install`` is a module-level function)."""
    if not os.environ.get(ENDPOINT_ENV):
        return fn
    return functools.partial(spawned_worker, fn, install)


def share_threads(workers: Any) -> None:
    """The ``workers`` this process spawns get its CPU threads split among them (their
    ``OMP_NUM_THREADS`` and ``DDPTUI_THREADS``, inherited; a forked one applies it in
    :func:`spawned_worker`): the spawner only waits for them. They took the spawner's whole
    share each: ignite's CIFAR-10 example with ``--nproc_per_node 2``, a one-rank run on two
    cores, ran two workers of two threads each, an epoch in 62 s against 8 s under plain
    ``python``."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        return
    from ddptui.rank.cpus import threads_for_workers

    threads = str(threads_for_workers(workers))
    os.environ["OMP_NUM_THREADS"] = threads
    os.environ[THREADS_ENV] = threads


def became_spawner(workers: int = 1) -> None:
    """This process now only waits for the ``workers`` it spawned: say so (a ``spawned``
    note: ddptui shows it waiting for their group, not its last frame, and does not call its
    silence a problem), then stop its heartbeat and mute its reporter, so it is neither shown
    nor judged as the rank its workers now are."""
    from ddptui import protocol  # loaded by the reporter anyway
    from ddptui.rank import heartbeat
    from ddptui.rank.reporter import get_reporter

    heartbeat.stop()
    stand_down()
    reporter = get_reporter()
    count_ok = isinstance(workers, int) and not isinstance(workers, bool)
    if count_ok and 1 <= workers <= protocol.MAX_GROWN_WORLD:
        reporter.note("spawned", workers=workers)
    reporter.mute()


def on_process_group(rank: int, world_size: int) -> None:
    """A process group was created in this process: this process is rank ``rank`` of
    ``world_size``. A spawned worker (or a script that passed its own rank) is announced
    under that rank now, with its heartbeat."""
    global _group_seen
    _group_seen = True
    if world.formed_after_alone():
        _formed_after_alone(world_size)
    env_rank = os.environ.get("RANK")
    spawned = bool(os.environ.get(SPAWNED_ENV))
    launched_world = world.launched if world.launched is not None else os.environ.get("WORLD_SIZE")
    if not spawned and launched_world is not None and launched_world != str(world_size):
        _own_group(rank, world_size)  # not the launcher's world: keeps its launched rank
        return
    if not spawned and env_rank == str(rank):
        return
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))
    if not os.environ.get(ENDPOINT_ENV):
        return
    from ddptui.rank import heartbeat
    from ddptui.rank.reporter import get_reporter

    reporter = get_reporter()
    reporter.rank = rank
    reporter.started(guess_device=False)
    heartbeat.start(reporter)
    _serve_as(rank)
    if _process_worker:
        _share_threads_among(world_size)
        if _formed_event is not None:  # the process that started this worker may go quiet now
            try:
                _formed_event.set(world_size)
            except Exception:  # telemetry never changes how a rank runs
                pass


def _formed_after_alone(world_size: int) -> None:
    """This rank formed its process group after it said it trained alone: said again, with
    the group's size (the dashboard takes the first back)."""
    if not os.environ.get(ENDPOINT_ENV):
        return
    from ddptui.rank.reporter import get_reporter

    try:
        get_reporter().note("alone", group_size=world_size)
    except Exception:  # telemetry never changes how a rank runs
        pass


def _own_group(rank: int, world_size: int) -> None:
    """This rank, launched as one of the run's world, formed a process group of another
    world (facebookresearch/swav's ``init_distributed_mode`` reads ``SLURM_PROCID`` and
    ``SLURM_NNODES`` before torchrun's ``RANK``: run inside a Slurm allocation, each of 2
    ranks made a world of its own as rank 0 of 1, both trained alone, and the run read
    "finished", rank 1's events taken as rank 0's). Said once, as a note; the rank keeps its
    launched rank, so that every process stays in view."""
    if not os.environ.get(ENDPOINT_ENV):
        return
    from ddptui.rank.reporter import get_reporter

    try:
        get_reporter().note(
            "own_group",
            group_rank=rank,
            group_size=world_size,
            slurm="SLURM_JOB_ID" in os.environ or "SLURM_PROCID" in os.environ,
        )
    except Exception:  # telemetry never changes how a rank runs
        pass


def _serve_as(rank: int) -> None:
    """What the rank entry sets up for a rank, for this worker that became one: its stacks,
    its Flight Recorder trace on request and on abort, the recorder's progress in its beats."""
    from ddptui.rank import flight_recorder, heartbeat

    try:
        flight_recorder.serve_rank(os.environ.get(RUN_DIR_ENV), rank)
        if flight_recorder.recording():
            heartbeat.set_collectives_source(flight_recorder.progress)
    except Exception:  # telemetry never changes how a rank runs
        pass


def stand_down() -> None:
    """This process only waits for its workers, which are the ranks: it answers ddptui's
    trace and stack requests for no rank any more (the worker that became its rank does)."""
    from ddptui.rank import flight_recorder

    try:
        flight_recorder.stop_trace_server()
    except Exception:  # telemetry never changes how a rank runs
        pass


def _share_threads_among(workers: int) -> None:
    """A worker started with ``multiprocessing.Process`` takes its share of the starting
    rank's threads once it knows how many workers share them (its group's world: one node's,
    in the shape these scripts have), as :func:`share_threads` gives mp.spawn's workers
    theirs. With the rank's whole share each, forked from a rank whose torch had set its
    threads, the tutorial's ``train_dist.py`` (two workers on two cores) took 36-41 s under
    ddptui against 10 s under ``python`` (4 times the CPU)."""
    if "torch" not in sys.modules or THREADS_ENV not in os.environ:
        return
    try:
        share_threads(workers)
        _take_thread_share()
    except Exception:  # telemetry never changes how a rank runs
        pass


def unranked() -> bool:
    """Whether this process is a worker the script started that never became a rank: it
    formed no process group (torch RPC's master or parameter server in pytorch/examples'
    ``ddp_rpc``, which join only the RPC world). It ends unheard, as it ran: at its exit it
    announced itself as rank 0 (the rank it inherited), its local rank 2 or 3 refused as
    outside the world, its ``finished`` taken as rank 0's."""
    return not learn_rank()


def learn_rank() -> bool:
    """A spawned worker whose group was created unseen learns its rank from the group now;
    True once this process's rank is known (or it is no spawned worker).

    A worker imports the script to unpickle the function it runs, so a script that imports
    ``init_process_group`` by name at its top (``from torch.distributed import ...``, as
    pytorch/examples' ``multigpu.py`` does) holds torch's own function before the hooks are
    in: the wrapper never sees the group, and every worker would report as the rank it
    inherited. The instrumentation asks here when a DDP module is made and at optimizer
    steps until the answer is yes; nothing is imported (torch is loaded by then or not)."""
    if _group_seen or not os.environ.get(SPAWNED_ENV):
        return True
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return False
        rank, world_size = dist.get_rank(), dist.get_world_size()
    except Exception:  # telemetry never changes how a rank runs
        return False
    on_process_group(rank, world_size)
    return True
