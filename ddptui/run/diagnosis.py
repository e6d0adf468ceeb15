"""Why a run is slow, stuck or dead: pure rules over what ddptui knows. No I/O, no clocks.

Next to :class:`~ddptui.run.state.RunState` so that headless, dashboard and replay agree. Every
finding is a :class:`Diagnosis` ``(rank, cause, detail, t)`` with numbers as evidence; ``t``
is seconds since the run started.

* **Stragglers** (:func:`find_straggler`), from each rank's recent phase breakdown
  (:class:`PhaseHistory`). DDP's all-reduce makes every rank's step time equal, so step times
  cannot say who is slow. Phases can: the rank that holds the others back reaches the
  all-reduce last and waits least in ``comm``, while its victims wait there for it. The
  culprit is the rank whose ``comm`` share is lowest while the others' is clearly higher;
  its cause is the phase it spends more of than the others: ``input`` (data wait),
  ``compute`` (forward, backward, optimizer), ``host`` (computing while it gets too little
  CPU, when per-rank CPU is known). When every rank waits in ``comm`` and none is late:
  ``communication``.
* **Hangs** (:func:`hang_limit`, :func:`hung_ranks`, :func:`classify_stack`,
  :func:`diagnose_hang`): a rank without progress for the limit is hung; its stacks say which
  ranks sit in a collective and which one is elsewhere (the culprit).
* **Crashes** (:func:`diagnose_crash`): the first rank to fail is the cause; ranks that fail
  after it with the errors a lost peer produces are consequences; a SIGKILL while memory was
  nearly exhausted is a likely out-of-memory kill.
* **Notes** (:func:`note_diagnosis`): what a rank noticed that is no failure, from its
  ``protocol.Note`` (a code and numbers; the sentence is made here): a shuffling
  ``DistributedSampler`` never told its epoch. Said once per run; never a verdict.
"""

from __future__ import annotations

import re
import statistics
import time
import traceback
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddptui.constants import PHASES
from ddptui.formatting import counted, error_head, ranks_text
from ddptui.rank.frames import Frame, StackInfo, classify
from ddptui.rank.heartbeat import BEAT_S
from ddptui.rank.stacks import STEPS_THREAD_MARK, whole_dump

#: Every cause a diagnosis can name.
CAUSES = (
    "input",  # a straggler starved by its input pipeline
    "compute",  # a straggler with more compute per step than the others
    "host",  # a straggler whose CPU is contended or throttled
    "communication",  # every rank waits for communication; no rank is late
    "hang",  # no progress; with stacks: the rank that is not in a collective
    "collective",  # in a hang, a rank that waits in a collective (a victim)
    "desync",  # a rank entered a collective with other arguments than the others (Flight Recorder)
    "context",  # after a crash: the collective a rank was in, from its Flight Recorder trace
    "crash",  # the first rank to fail
    "consequence",  # a rank that failed because another one did
    "oom",  # a rank killed (SIGKILL) while memory was nearly exhausted
    "sampler",  # a note: a shuffling DistributedSampler never told its epoch (no verdict)
    "no_comm",  # a note: every rank trained many steps without any collective (no verdict)
    "spawners",  # a note: several launched processes of a node spawned workers (no verdict)
    "own_group",  # a note: a launched rank formed a process group of another world (no verdict)
    "same_batches",  # a note: every rank drew the same first batch, no DistributedSampler
    "alone",  # a note: every rank trains alone: no process group, or accelerate's one process
    "record_growth",  # a note: events.jsonl grows fast enough to fill a disk (no verdict)
    "instrumentation",  # a note: ddptui's step hooks turned themselves off in a rank (no verdict)
    "lingering",  # a note: every rank finished, and processes of the run still run (no verdict)
    "loader_restart",  # a note: a pass waits long for its DataLoader's workers to start again
    "own_error",  # a note: ddptui's own code raised applying events or diagnosing (no verdict)
    "data_parallel",  # a note: ranks share batches (tensor/pipeline parallel): counted once
    "summed_loss",  # a note: FSDP sums the gradients: each rank's loss shown times the ranks
)


#: Causes that describe the run's current shape, found again while it lasts (or each time it
#: comes back): shown once, as last found (see :func:`shown_details`).
RECURRING = ("input", "compute", "host", "communication")


def shown_details(found: Iterable[tuple[int | None, str, str]]) -> list[str]:
    """The details of ``(rank, cause, detail)`` diagnoses, in order, to show: a recurring
    finding (:data:`RECURRING`) once, where and as it was last found (a run that went
    communication-bound, briefly was not, and was again showed the line twice, 35 % and
    33 %); every other one as it is."""
    found = list(found)
    last = {(rank, cause): i for i, (rank, cause, _) in enumerate(found) if cause in RECURRING}
    return [
        detail
        for i, (rank, cause, detail) in enumerate(found)
        if cause not in RECURRING or last[rank, cause] == i
    ]


@dataclass(frozen=True)
class Diagnosis:
    """One finding: the rank it names (None: the run as a whole), why, the evidence, and
    when (seconds since the run started)."""

    rank: int | None
    cause: str
    detail: str
    t: float

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "cause": self.cause, "detail": self.detail, "t": self.t}


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.0f} %"


# -- phase history ---------------------------------------------------------------------------
#: Steps (with phases) kept per rank for the straggler rule.
WINDOW = 30
#: Steps a rank needs in its window before it is judged.
MIN_STEPS = 5
#: The victims' comm share must exceed the culprit's by this much (share of the step)...
#: A quarter of the step: two healthy ranks sharing busy cores differ by 10-15 points of
#: comm share from scheduling alone, and a verdict must stand on more than that.
WAIT_GAP = 0.25
#: ...and be at least this much...
MIN_VICTIM_WAIT = 0.25
#: ...and the culprit's own extra work (its non-comm phases above the others') must account
#: for at least this share of the gap: a rank that waits less without working more is noise.
EXPLAINED_GAP = 0.5
#: Every rank waiting at least this share of its step in comm, with no culprit: comm-bound.
COMM_BOUND = 0.30
#: A compute straggler getting less than this share of one core while computing: ``host``.
HOST_SHARE = 0.6


class PhaseHistory:
    """The built-in phase shares of each rank's recent steps (a bounded window per rank)."""

    def __init__(self, window: int = WINDOW, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.clock = clock
        #: Per rank, its window: one tuple of shares per step, in :data:`PHASES` order.
        self._shares: dict[int, deque[tuple[float, ...]]] = {}
        #: Per rank, the steps come since its window was last read, as they came: (their
        #: phases, how many steps they stand for), the last :attr:`window` of them. Steps come
        #: in far more often than the window is read (256 ranks at 10 steps/s is 2,560 steps
        #: a second; the phase bars and the straggler rule read every rank about once a
        #: second), so a step is only kept here, and a read makes the shares of those come
        #: since, in one loop (:meth:`_settle`): made one by one as each step came, in the
        #: pump between a frame's events, they cost 10 us a step at 256 ranks, a quarter of
        #: the pump's time, and more than half of that is the call's own.
        self._new: dict[int, deque[tuple[Mapping[str, float], int]]] = {}
        #: Per rank, its medians in :data:`PHASES` order and when they were computed: a read
        #: sorts the window's columns once per change; a reader that accepts medians a little
        #: old (the bars) takes the straggler rule's, computed a moment before.
        self._medians: dict[int, tuple[tuple[float, ...], float]] = {}
        #: Ranks whose window changed since their medians were computed.
        self._changed: set[int] = set()
        #: Per rank whose window holds an event of several steps (a very fast script's, see
        #: ``protocol.Step.steps``), how many steps each of its window's events stands for.
        self._counts: dict[int, deque[int]] = {}

    def add(self, rank: int, phases: Mapping[str, float] | None, steps: int = 1) -> None:
        """One step's (or one explicit log's) phases in seconds; ``steps``: how many steps
        they are the sums of. Kept as they are (not copied: an event's phases are not
        changed after it came) until the window is read."""
        if not phases or self.window <= 0:  # a window of no steps keeps none
            return
        new = self._new.get(rank)
        if new is None:
            new = self._new[rank] = deque(maxlen=self.window)
        new.append((phases, steps))

    def _settle(self, rank: int) -> None:
        """The steps come since the rank's window was last read, into it as shares."""
        new = self._new.pop(rank, None)
        if not new:
            return
        window = self._shares.get(rank)
        if window is None:
            window = self._shares[rank] = deque(maxlen=self.window)
        counts = self._counts.get(rank)
        for phases, steps in new:
            get = phases.get
            seconds = [get(p, 0.0) for p in PHASES]
            # Every phase a float, none negative and their sum finite (no NaN, no infinity):
            # taken as received, checked at C speed. Otherwise each value is cleaned by
            # itself (_seconds).
            if not (
                set(map(type, seconds)) == _FLOAT
                and (total := sum(seconds)) < _INF
                and min(seconds) >= 0.0
            ):
                seconds = [_seconds(value) for value in seconds]
                total = sum(seconds)
            if total <= 0:
                continue
            if counts is None and steps > 1:
                counts = self._counts[rank] = deque([1] * len(window), maxlen=self.window)
            if counts is not None:
                counts.append(steps)
            window.append(tuple([value / total for value in seconds]))
            self._changed.add(rank)

    def _settle_all(self) -> None:
        for rank in list(self._new):
            self._settle(rank)

    def covered(self) -> int:
        """The most steps a rank's window stands for: what the medians are over (the window's
        length, or more where a very fast script's events each hold several steps)."""
        self._settle_all()
        if not self._shares:
            return 0
        counts = self._counts
        return max(
            sum(counts[rank]) if rank in counts else len(window)
            for rank, window in self._shares.items()
        )

    def steps(self, rank: int) -> int:
        self._settle(rank)
        return len(self._shares.get(rank, ()))

    def ranks(self) -> list[int]:
        self._settle_all()
        return sorted(self._shares)

    def median_shares(self, rank: int, max_age: float | None = None) -> dict[str, float]:
        """Median share of the step per built-in phase over the window: of the window as it
        is, or (``max_age``) as it was at most that many seconds ago, when computed then."""
        cached = self._medians.get(rank)
        if cached is not None and max_age is not None and self.clock() - cached[1] <= max_age:
            return dict(zip(PHASES, cached[0], strict=True))
        self._settle(rank)
        if cached is not None and rank not in self._changed:
            return dict(zip(PHASES, cached[0], strict=True))
        window = self._shares.get(rank)
        if not window:
            return dict.fromkeys(PHASES, 0.0)
        columns = zip(*window, strict=True)  # every step's tuple has one share per phase
        medians = tuple(_median_of_sorted(sorted(column)) for column in columns)
        self._medians[rank] = (medians, self.clock())
        self._changed.discard(rank)
        return dict(zip(PHASES, medians, strict=True))


def _median_of_sorted(values: list[float]) -> float:
    """``statistics.median`` of values already in order (the same arithmetic)."""
    middle = len(values) // 2
    if len(values) % 2:
        return values[middle]
    return (values[middle - 1] + values[middle]) / 2


_INF = float("inf")
_FLOAT = {float}


def _seconds(value: object) -> float:
    if type(value) is float:  # the common case, first
        return value if 0.0 <= value < _INF else 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    value = float(value)
    return value if 0.0 <= value < float("inf") else 0.0


def find_straggler(
    history: PhaseHistory,
    ranks: Iterable[int] | None = None,
    cpu_percent: Mapping[int, float] | None = None,
    t: float = 0.0,
) -> Diagnosis | None:
    """The rank that holds the others back and why, or a communication-bound run, or None.

    ``ranks`` limits the judgement to these (the live ones); each needs :data:`MIN_STEPS`
    steps of history. ``cpu_percent`` (rank -> CPU percent of its process tree, 100 = one
    core, e.g. from the monitor) lets a compute straggler be told apart as ``host``.
    TODO: CPU throttling (cgroup ``cpu.stat`` nr_throttled) as a second host signal.
    """
    candidates = history.ranks() if ranks is None else sorted(set(ranks))
    judged = [r for r in candidates if history.steps(r) >= MIN_STEPS]
    if len(judged) < 2:
        return None
    shares = {r: history.median_shares(r) for r in judged}
    culprit = min(judged, key=lambda r: (shares[r]["comm"], r))
    others = [r for r in judged if r != culprit]
    victims_wait = statistics.median(shares[r]["comm"] for r in others)
    gap = victims_wait - shares[culprit]["comm"]
    if gap >= WAIT_GAP and victims_wait >= MIN_VICTIM_WAIT:
        extra = sum(
            max(0.0, shares[culprit][p] - statistics.median(shares[r][p] for r in others))
            for p in PHASES
            if p not in ("comm", "eval")
        )
        if extra >= EXPLAINED_GAP * gap:
            return _straggler(culprit, others, shares, victims_wait, cpu_percent, t)
    everyone = statistics.median(shares[r]["comm"] for r in judged)
    if everyone >= COMM_BOUND:
        return Diagnosis(
            None,
            "communication",
            f"communication-bound: the ranks wait {_pct(everyone)} of their step in "
            f"communication (median) and no rank holds the others back",
            t,
        )
    return None


def stepping_cpu(
    state: Any, cpu_percent: Mapping[int, float] | None, now: float
) -> dict[int, float] | None:
    """The CPU readings of the ranks that step at ``now`` (for the end-of-run verdict, which
    judges ranks that have stopped; the live check judges only stepping ones): the ``host`` cause
    compares a rank's CPU with the compute share of its steps, and a rank paused (waiting in
    the gradient all-reduce while rank 0 alone evaluates, as nanoGPT's ``train.py`` does) idles
    for reasons its steps do not show: a rank named "host, gets 6 % CPU" there was wrong."""
    if cpu_percent is None:
        return None
    ranks = state.ranks
    return {
        rank: cpu
        for rank, cpu in cpu_percent.items()
        if (view := ranks.get(rank)) is not None and view.stepping_at(now)
    }


def _straggler(
    culprit: int,
    others: list[int],
    shares: dict[int, dict[str, float]],
    victims_wait: float,
    cpu_percent: Mapping[int, float] | None,
    t: float,
) -> Diagnosis:
    mine = shares[culprit]

    def typical(phase: str) -> float:
        return statistics.median(shares[r][phase] for r in others)

    # comm is where victims wait; an evaluation pass is no part of the step's own work
    excess = {p: mine[p] - typical(p) for p in PHASES if p not in ("comm", "eval")}
    compute_phases = ("forward", "backward", "optimizer", "other")
    compute_excess = sum(excess[p] for p in compute_phases)
    victims = f"the other ranks wait {_pct(victims_wait)} of their step in communication"
    if excess["data"] >= compute_excess:
        return Diagnosis(
            culprit,
            "input",
            f"rank {culprit} straggler: input (data wait {_pct(mine['data'])} of step vs "
            f"{_pct(typical('data'))} median; {victims})",
            t,
        )
    worst = max(compute_phases, key=lambda p: excess[p])
    computing = sum(mine[p] for p in compute_phases)
    cpu = None if cpu_percent is None else cpu_percent.get(culprit)
    if (
        isinstance(cpu, int | float)
        and not isinstance(cpu, bool)
        and 0 <= cpu < HOST_SHARE * computing * 100
    ):
        return Diagnosis(
            culprit,
            "host",
            f"rank {culprit} straggler: host (computes {_pct(computing)} of its step but gets "
            f"{cpu:.0f} % CPU: its cores are contended or throttled; {victims})",
            t,
        )
    return Diagnosis(
        culprit,
        "compute",
        f"rank {culprit} straggler: compute ({worst} {_pct(mine[worst])} of step vs "
        f"{_pct(typical(worst))} median; {victims})",
        t,
    )


# -- hangs -------------------------------------------------------------------------------------
# A verdict needs evidence, never silence alone: a rank is *stuck* when its heartbeat shows a
# stack (and steps and collectives) that has not moved for the limit while its process used
# almost no CPU. A rank preparing (tokenising, compiling), computing a long step or waiting on
# a busy peer moves its stack or burns CPU; a rank blocked in a collective or a deadlock does
# neither.
#
# How the default limit was chosen: 60 s, or 20 typical step times when that is longer. A
# healthy rank rarely stands still, CPU idle, for a minute: a step, an evaluation pass or a
# checkpoint keeps the stack moving or the CPU busy; and a minute names a hang long before
# torch's own collective timeouts end the run (10 min for NCCL, 30 min for gloo) with less to
# say. Before a rank's first step the default is :data:`PREPARE_HANG_S` instead: one rank
# downloading or indexing data while its peers wait at a barrier is normal start-up. An
# explicit ``--hang-timeout`` applies before and after the first step alike.

#: The default hang limit: at least this many seconds...
HANG_MIN_S = 60.0
#: ...and at least this many typical step times.
HANG_STEPS = 20
#: The default limit before a rank's first step (unless ``--hang-timeout`` is given).
PREPARE_HANG_S = 300.0
#: A rank standing still used less than this share of one core (its DataLoader workers
#: included): its CPU idles. A rank blocked in a collective, a lock or a sleep uses ~0; a busy
#: one gets far more even on a crowded machine (at a load of 13 on 2 cores, about 15 %).
IDLE_CPU_SHARE = 0.02
#: A rank standing still that read or wrote less than this per second (its heartbeat's
#: ``io``: files, pipes, TLS connections and storage; a checkpoint on a slow network file
#: system, or streamed to object storage, moves megabytes a second with its CPU idle; a rank
#: blocked in a collective moves nothing; a plain socket's traffic counts while the stack stands
#: still, ``heartbeat.Heartbeat.socket_moved``) does no I/O.
IDLE_IO_BYTES_PER_S = 64 * 1024
#: The waiting note says the working rank's stack stood in one place when it did for at
#: least this share of the time the waiting ranks stood still, less two beats: each rank's
#: stillness is read at its own beats, which may start a beat late and end a beat early (an
#: endless loop read 3 s still beside a 5 s wait, .ci/run under load); and never under
#: :data:`WAIT_STILL_BEATS` beats.
STILL_TOO_SHARE = 0.75
#: A rank standing still outside any collective whose sampled thread slept and woke at least
#: this often a second meanwhile (``Beat.wakes``) polls: a loop that waits a moment at a time
#: (for a staged file, a flag, a free GPU), its stack sampled at the same line each beat, is
#: at work as a loop that computes is. Every rank of a script that waited 20 s for a file in
#: ``while …: time.sleep(0.5)`` was torn down as hung at ``--hang-timeout 5``, "stack unchanged
#: for 6 s, 0.0 CPU s". A thread blocked in one call (a lock, a read, one long sleep, a
#: collective) wakes no more; torch's DataLoader checks its workers every 5 s while it waits
#: for a batch (0.2 a second), so a loader whose worker hangs is still judged.
POLL_WAKES_PER_S = 0.5
#: Beats older than this many beat intervals: the rank's heartbeat itself has stopped.
BEAT_LATE = 3
#: Seconds of ddptui's own CPU and I/O samples that say what a rank whose beats stopped does now
#: (busy, or moving data: works; idle: stuck, once it stood still for the limit). Read over 20 s, a
#: rank stopped mid-step (SIGSTOP, a frozen machine) "worked" for up to 20 s after its CPU fell to
#: nothing (pytorch/examples' imagenet, rank 1 stopped by SIGSTOP: "waiting for rank 1, which works"
#: 22 s after rank 1's last beat; the verdict 3 s later).
RECENT_CPU_S = 5.0
#: A rank's stack stood still for this many beats in a collective: it waits there (fewer: one
#: sample, which may have caught a working rank passing through a collective's code).
WAIT_STILL_BEATS = 2


def hang_limit(state: Any, hang_timeout: float | None = None) -> float | None:
    """Seconds a rank may stand still (after its first step) before it counts as stuck:
    ``hang_timeout`` when given (0 turns hang detection off: None), else the larger of 60 s
    and 20x the median step time."""
    if hang_timeout is not None:
        return float(hang_timeout) if hang_timeout > 0 else None
    typical = [v.typical_step_time for v in state.ranks.values() if v.typical_step_time is not None]
    median = statistics.median(typical) if typical else 0.0
    return max(HANG_MIN_S, HANG_STEPS * median)


def prepare_limit(limit: float | None, hang_timeout: float | None = None) -> float | None:
    """The limit before a rank's first step: ``--hang-timeout`` when given, else the larger
    of the running limit and :data:`PREPARE_HANG_S`."""
    if limit is None:
        return None
    return limit if hang_timeout is not None else max(limit, PREPARE_HANG_S)


@dataclass(frozen=True)
class Stuck:
    """Evidence that one rank is stuck: how long it stood still and what it did meanwhile."""

    rank: int
    seconds: float
    #: CPU seconds it used while standing still (None: not known from its heartbeat).
    cpu: float | None
    #: Where its main thread is (its heartbeat's frame), and the collective it waits in.
    frame: str | None = None
    waiting: str | None = None
    #: ``heartbeat``: its own beats showed it; ``silent``: its beats stopped (the GIL held or
    #: the process stopped) and ddptui's own CPU sample of it idles.
    how: str = "heartbeat"

    def describe(self) -> str:
        where = f" in {self.waiting}" if self.waiting else ""
        where += f" at {self.frame}" if self.frame else ""
        if self.how == "silent":  # where its last beat saw it: it may have gone on since
            where = f", last seen{where}" if where else ""
            return f"rank {self.rank}{where}: heartbeat silent for {self.seconds:.0f} s, CPU idle"
        cpu = "" if self.cpu is None else f", {self.cpu:.1f} CPU s"
        return f"rank {self.rank}{where}: stack unchanged for {self.seconds:.0f} s{cpu}"


def stuck_ranks(
    state: Any,
    now: float,
    limit: float | None,
    before_first_step: float | None = None,
    cpu_percent: Mapping[int, float] | None = None,
    beat_s: float = BEAT_S,
    io_rate: Mapping[int, float] | None = None,
) -> dict[int, Stuck]:
    """The live ranks with evidence of being stuck (rank -> :class:`Stuck`).

    From the rank's heartbeat: its stack, steps and collectives have not moved for the limit
    (``before_first_step`` until its first step), it used under :data:`IDLE_CPU_SHARE` of a
    core meanwhile, and it read or wrote under :data:`IDLE_IO_BYTES_PER_S` (files, pipes,
    TLS connections, storage; where the kernel counts it). A rank whose beats stopped coming
    (its heartbeat thread cannot run: the GIL is held, or the process is stopped) is stuck
    only when it stood still up to its last beat and ddptui's own recent samples of it idle:
    its CPU (``cpu_percent``) and, where known, its I/O (``io_rate``, bytes a second; the
    diagnoser passes :data:`RECENT_CPU_S` of both). A C call that keeps the GIL while it
    waits on storage (``import torch`` from a network file system: its libraries' pages
    fault in from there) stops the beats with the CPU idle, and only its I/O shows it works:
    a rank that read a pipe at 1 MB/s inside one such call was torn down as hung. A rank that
    sends no beats at all (an older ddptui, or a rank that has not announced itself) is
    never judged: silence is not evidence; nor is a spawner, which stopped beating to wait
    for the workers it started until one of them announces itself under its rank (its idle
    wait while they import torch and meet is by design). Nothing is stuck once the run has
    ended.
    """
    if limit is None or state.outcome:
        return {}
    stuck: dict[int, Stuck] = {}
    for rank, view in state.ranks.items():
        if view.state != "started" or view.beat_at is None or view.still_since is None:
            continue
        if view.spawned:
            continue
        allowed = limit if view.step > 0 else (before_first_step or limit)
        late = now - view.beat_at > BEAT_LATE * beat_s
        if late:
            quiet = now - view.still_since
            cpu = (cpu_percent or {}).get(rank)
            moved = (io_rate or {}).get(rank)
            if (
                quiet >= allowed
                and cpu is not None
                and cpu < IDLE_CPU_SHARE * 100
                and (moved is None or moved < IDLE_IO_BYTES_PER_S)
            ):
                stuck[rank] = Stuck(rank, quiet, None, view.frame, view.waiting, "silent")
            continue
        still = view.still_for or 0.0
        used, io = view.cpu_while_still, view.io_while_still
        if (
            still >= allowed
            and used is not None
            and used < IDLE_CPU_SHARE * still
            and (io is None or io < IDLE_IO_BYTES_PER_S * still)
            and not polls(view)
        ):
            stuck[rank] = Stuck(rank, still, used, view.frame, view.waiting)
    return stuck


def polls(view: Any) -> bool:
    """Whether a rank standing still outside any collective polls: its sampled thread woke
    at least :data:`POLL_WAKES_PER_S` times a second while it stood still."""
    wakes, still = view.wakes_while_still, view.still_for
    return (
        not view.waiting
        and wakes is not None
        and still is not None
        and still > 0
        and wakes >= POLL_WAKES_PER_S * still
    )


def working_ranks(
    state: Any,
    now: float,
    stuck: Mapping[int, Stuck],
    cpu_percent: Mapping[int, float] | None = None,
    beat_s: float = BEAT_S,
    io_rate: Mapping[int, float] | None = None,
) -> list[int]:
    """The live ranks with evidence that they still work while the ``stuck`` ones stand still:
    their beats come and they are not stuck themselves (their stack moves, they use CPU, or they
    read or write: files, pipes, TLS, storage), or their beats stopped but ddptui's own sample
    of their CPU (``cpu_percent``: pass the recent one, :data:`RECENT_CPU_S`) is busy or of
    their I/O (``io_rate``) moves (a long call that holds the GIL). Ranks that wait in a
    collective for one of these are waiting, not hung: a rank-0 checkpoint or evaluation longer
    than the limit is work. A rank that waits in a collective itself is no such rank, busy or
    not (a CUDA synchronisation spins while an NCCL collective waits for a peer): its stack is
    in one, or its NCCL Flight Recorder shows one started and not completed that no rank has
    completed either (one another rank completed is stale on this one: every rank entered it and
    nobody waits in it for a peer). gloo's marks are not read here: a gloo wait shows on the
    stack, and its marks may lag a rank that went on. A rank that sends no beats, or whose beats
    stopped while neither its CPU nor its I/O is known busy, shows no work: silence is no
    evidence either way. Waiting is read with the stack's stillness: a rank waits in a
    collective when its stack has stood still there for :data:`WAIT_STILL_BEATS` beats. One beat
    is one sample of a stack: a rank that evaluates through its DDP module (nanoGPT's rank-0
    ``estimate_loss``) is caught inside DDP's own code now and then, and one such sample made a
    healthy run's verdict "hung"; a wait stands still, work moves."""
    done = completed_anywhere(state)
    working = []
    for rank, view in state.ranks.items():
        if rank in stuck or view.state != "started" or view.beat_at is None:
            continue
        if (view.still_for or 0.0) >= WAIT_STILL_BEATS * beat_s and (
            view.waiting or rank_wait_marks(view, done)
        ):
            continue
        if now - view.beat_at > BEAT_LATE * beat_s:
            cpu = (cpu_percent or {}).get(rank)
            moved = (io_rate or {}).get(rank)
            busy = cpu is not None and cpu >= IDLE_CPU_SHARE * 100
            if not busy and (moved is None or moved < IDLE_IO_BYTES_PER_S):
                continue
        working.append(rank)
    return sorted(working)


def completed_anywhere(state: Any) -> dict[tuple[str, str | None], int]:
    """Per process group and backend, the highest collective number any rank's Flight Recorder
    completed."""
    done: dict[tuple[str, str | None], int] = {}
    for view in state.ranks.values():
        for group, _op, _started, completed, backend in view.collectives:
            if completed is not None and completed > done.get((group, backend), -1):
                done[group, backend] = completed
    return done


#: Backends whose recorder marks are no evidence that a rank waits in a collective: a gloo
#: wait blocks the thread that called it, so it shows on the rank's stack and its CPU idles;
#: only an NCCL wait can hide behind a busy host (a CUDA synchronisation spins). gloo's marks
#: may also lag the rank (a collective left "started" while the rank went on).
QUIET_WAIT_BACKENDS = frozenset({"gloo"})


def waiting_marks(
    collectives: tuple, done: Mapping[tuple[str, str | None], int], spinning: bool = False
) -> tuple[tuple[str, int], ...]:
    """A rank's Flight Recorder marks (``(group, op, started, completed, backend)``) of
    collectives it started and has not completed that no rank completed either (``done``: see
    :func:`completed_anywhere`), as ``(group, started)``: the ones it may wait in for a peer.
    ``spinning``: only backends whose wait may keep the host busy (not
    :data:`QUIET_WAIT_BACKENDS`; an unnamed backend counts)."""
    return tuple(
        (group, started)
        for group, _op, started, completed, backend in collectives
        if started is not None
        and (completed is None or completed < started)
        and started > done.get((group, backend), -1)
        and not (spinning and backend in QUIET_WAIT_BACKENDS)
    )


def rank_wait_marks(view: Any, done: Mapping[tuple[str, str | None], int]) -> tuple:
    """The collectives a live rank may wait in for a peer (:func:`waiting_marks`): gloo's
    only while its stack is in a collective (a gloo wait blocks the calling thread, and its
    marks may lag a rank that went on: moco's ranks starting their loaders' workers still had
    DDP's last setup broadcast open), NCCL's whatever the stack says."""
    return waiting_marks(view.collectives, done, spinning=not view.waiting)


def _waiting_detail(
    state: Any, stuck: Mapping[int, Stuck], working: list[int], beat_s: float = BEAT_S
) -> str:
    """The waiting note's text, e.g. ``ranks 1, 2 stood still for 75 s (in barrier), waiting
    for rank 0, which works (at save (train.py:120)): not a hang while it does``; when the
    working rank's own stack stood in one place as long, the note says that too."""
    names = ", ".join(str(r) for r in sorted(stuck)[:8]) + (" …" if len(stuck) > 8 else "")
    first = stuck[min(stuck)]
    where = f" (in {first.waiting})" if first.waiting else ""
    busy = ", ".join(str(r) for r in working[:8]) + (" …" if len(working) > 8 else "")
    view = state.ranks[working[0]]
    at = f" (at {view.frame})" if view.frame else ""
    # Busy with its stack in one place about as long as the others stood still (most of it:
    # the two are measured at their own beats): one long call (a checkpoint pickled in one
    # go) or a loop that never ends look alike from here; say so.
    still = view.still_for or 0.0
    if still >= max(STILL_TOO_SHARE * first.seconds - 2 * beat_s, WAIT_STILL_BEATS * beat_s):
        if polls(view):  # wakes_while_still is known there
            at += (
                f", its stack in one place for {still:.0f} s, waking "
                f"{view.wakes_while_still / still:.1f} times a second (a loop that waits)"
            )
        else:
            at += f", its stack in one place for {still:.0f} s (one long call, or a loop that "
            at += "never ends)"
    ranks = "ranks" if len(stuck) > 1 else "rank"
    others = "ranks" if len(working) > 1 else "rank"
    return (
        f"{ranks} {names} stood still for {first.seconds:.0f} s{where}, waiting for {others} "
        f"{busy}, which work{'' if len(working) > 1 else 's'}{at}: not a hang while "
        f"{'they do' if len(working) > 1 else 'it does'}"
    )


_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+?)\s*$')
_STEPS_THREAD = re.compile("^" + re.escape(STEPS_THREAD_MARK) + r"(0x[0-9a-fA-F]+)$", re.M)


def parse_threads(text: str) -> list[tuple[int, list[Frame]]]:
    """The threads of a faulthandler dump with their idents, each as frames innermost first,
    in dump order."""
    threads: list[tuple[int, list[Frame]]] = []
    current: list[Frame] | None = None
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            current = []
            threads.append((int(head.group(2), 16), current))
            continue
        match = _FRAME.match(line)
        if match and current is not None:
            current.append(Frame(match.group(1), int(match.group(2)), match.group(3)))
    return [(ident, frames) for ident, frames in threads if frames]


def training_thread(text: str) -> list[Frame]:
    """The thread of a dump that trains: the one the rank named before its dump (its steps
    come from another thread than the main one), else :func:`main_thread`."""
    threads = parse_threads(text)
    marks = _STEPS_THREAD.findall(text)
    if marks:
        ident = int(marks[-1], 16)
        named = next((frames for tid, frames in threads if tid == ident), None)
        if named is not None:
            return named
    return main_thread([frames for _, frames in threads])


def main_thread(threads: list[list[Frame]]) -> list[Frame]:
    """The thread running the script: the one whose outermost frame is ``<module>`` or the
    rank entry, else the last one dumped (faulthandler lists the newest thread first)."""
    for frames in threads:
        bottom = frames[-1]
        if bottom.func == "<module>" or bottom.file.endswith(
            ("ddptui/rank/entry.py", "multiprocessing/spawn.py")
        ):
            return frames
    return threads[-1] if threads else []


def classify_stack(text: str, ddp: bool = True) -> StackInfo:
    """Whether a rank's training thread (:func:`training_thread`: its main thread, unless it
    trains in another) sits in a collective, from its faulthandler dump (see
    :func:`ddptui.rank.frames.classify`; ``ddp`` False: the rank holds no DDP module)."""
    return classify(training_thread(text), ddp=ddp)


def diagnose_hang(
    hung: Mapping[int, float],
    stacks: Mapping[int, str],
    limit: float,
    t: float,
    no_ddp: Collection[int] = (),
) -> list[Diagnosis]:
    """Name the hung rank from every rank's stacks: a rank outside any collective is the
    culprit (``hang``); ranks in a collective wait for it (``collective``). Without a culprit
    (all in collectives: mismatched collectives or a lost peer; or no stacks) the hang is
    reported for the run as a whole. The ranks in ``no_ddp`` hold no DDP module, by their
    beats: a ``backward()`` in their stacks is their own work, not the gradient all-reduce
    (pytorch/examples' ImageNet script on the CPU wraps no DDP; its ranks in ``backward()``
    were read as waiting in "DDP gradient all-reduce")."""
    quiet = max(hung.values()) if hung else 0.0
    head = f"{ranks_text(hung)} stood still for {quiet:.0f} s, CPU idle (limit {limit:g} s)"
    # A dump cut before its main thread's end (see whole_dump) says nothing of where the
    # rank is: read as another thread's, a rank waiting in the gradient all-reduce was once
    # named hung outside any collective.
    cut = sorted(rank for rank, text in stacks.items() if not whole_dump(text))
    if cut:
        head += f"; the stack of {ranks_text(cut)} was cut off"
    infos = {
        rank: classify_stack(text, ddp=rank not in no_ddp)
        for rank, text in sorted(stacks.items())
        if rank not in cut
    }
    waiting = {r: i for r, i in infos.items() if i.in_collective}
    culprits = {r: i for r, i in infos.items() if not i.in_collective}
    out: list[Diagnosis] = []
    if waiting:
        names = sorted({i.collective or "?" for i in waiting.values()})
        verb = "waits" if len(waiting) == 1 else "wait"
        waits = f"{ranks_text(waiting)} {verb} in a collective ({'; '.join(names)})"
    elif cut:
        waits = "no rank with a whole stack waits in a collective"
    else:
        waits = "no rank waits in a collective"
    for rank, info in culprits.items():
        out.append(
            Diagnosis(
                rank,
                "hang",
                f"rank {rank} hung outside any collective, in {info.where}, while {waits}; {head}",
                t,
            )
        )
    for rank, info in waiting.items():
        out.append(
            Diagnosis(
                rank,
                "collective",
                f"rank {rank} waits in {info.collective}, called from {info.where}",
                t,
            )
        )
    if not culprits:
        unseen = sorted(set(hung) - set(infos))
        if waiting and unseen:  # (a rank on another node: its stack stays there)
            why = f"{waits}; no stack from {ranks_text(unseen)}"
        elif waiting:
            why = f"every rank with a stack waits in a collective ({waits}): mismatched "
            why += "collectives, or a peer that is gone"
        else:
            why = "no stacks captured"
        out.insert(0, Diagnosis(None, "hang", f"{head}; {why}", t))
    return out


# -- crashes -----------------------------------------------------------------------------------
#: Errors a rank gets when a peer died or stalled (the collective breaks under it). Whole
#: words where a word is part of others: every ``TypeError`` ("peEr") read as a lost peer's,
#: and DeiT's two ranks failing on the same TypeError were "a consequence of rank 0's".
CONSEQUENCE = re.compile(
    r"connection (?:reset|closed|refused|lost)|closed by peer|broken pipe|\bpeers?\b|gloo|nccl"
    r"|ProcessGroup|DistBackendError|DistNetworkError|socket|recvBytes|sendBytes|\btimed? ?out"
    r"|timeout|watchdog|heartbeat|abort",
    re.I,
)
#: Host (or cgroup) memory use that makes a SIGKILL a likely out-of-memory kill.
OOM_MEMORY_FRACTION = 0.95
_KILL_SIGNALS = ("SIGKILL",)
_TEARDOWN_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")


@dataclass(frozen=True)
class RankEnd:
    """How one rank ended badly: when its failure was reported (None: it said nothing, e.g.
    killed), its error and traceback, and the signal or exit code the launcher saw."""

    rank: int
    t: float | None = None
    error: str | None = None
    traceback: str | None = None
    signal: str | None = None
    exit_code: int | None = None

    @property
    def killed(self) -> bool:
        return self.signal in _KILL_SIGNALS or self.exit_code in (-9, 137)

    @property
    def consequence_like(self) -> bool:
        """Its error is what a lost peer causes, or ddptui's teardown signalled it."""
        if self.signal in _TEARDOWN_SIGNALS:
            return True
        text = self.error or ""
        if self.traceback:
            text += "\n" + self.traceback.strip().splitlines()[-1]
        return bool(text) and bool(CONSEQUENCE.search(text)) and not self.killed


@dataclass(frozen=True)
class MemoryState:
    """Memory pressure around the failure: the highest host memory use seen recently (0..1)
    and the cgroup's use against its limit, and OOM kills counted in ``memory.events``."""

    host_fraction: float | None = None
    cgroup_current: int | None = None
    cgroup_max: int | None = None
    oom_kills: int = 0

    def nearly_full(self) -> str | None:
        """Why memory counts as nearly exhausted (the evidence), or None."""
        reasons = []
        if self.oom_kills > 0:
            reasons.append(f"the cgroup counted {self.oom_kills} OOM kill(s)")
        if self.host_fraction is not None and self.host_fraction >= OOM_MEMORY_FRACTION:
            reasons.append(f"host memory was {_pct(self.host_fraction)} used")
        if self.cgroup_current and self.cgroup_max and self.cgroup_max > 0:
            fraction = self.cgroup_current / self.cgroup_max
            if fraction >= OOM_MEMORY_FRACTION:
                reasons.append(f"the cgroup was at {_pct(fraction)} of its memory limit")
        return " and ".join(reasons) or None


def _bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{value} B"  # pragma: no cover


def _error_line(end: RankEnd) -> str:
    """A failed rank's error in one line: the first of its error (``UnpicklingError: Weights
    only load failed…``: the type and what went wrong; torch's messages go on with advice, and
    their last line, ``Check the documentation of torch.load…``, had said the two ranks of
    facebookresearch/vicreg "failed with the same error"), else its traceback's last line (the
    exception), else how it ended."""
    if end.error:
        return error_head(end.error)[0][:300] or end.error
    if end.traceback and end.traceback.strip():
        return end.traceback.strip().splitlines()[-1][:300]
    if end.signal:
        return f"killed by {end.signal}"
    if end.exit_code is not None:
        return f"exit code {end.exit_code}"
    return "failed"


def rank_ends(state: Any) -> list[RankEnd]:
    """Every failed rank of ``state`` with what is known of its end: the time of its last
    event (its failure status), error and traceback from its events, and the launcher's exit
    code and signal for the rank the launcher names."""
    failure = getattr(state, "failure", None)
    ends = []
    for rank, view in sorted(state.ranks.items()):
        launcher = (
            failure is not None
            and getattr(failure, "rank", None) == rank
            and not getattr(failure, "spawner", False)
        )
        if view.state != "failed" and not launcher:
            continue
        described = launcher and failure is not None and view.error == failure.describe()
        reported = view.error is not None and not described  # the rank's own words
        error = view.error if reported else (failure.error if launcher else None)
        ends.append(
            RankEnd(
                rank=rank,
                t=view.last_seen if reported else None,
                error=error,
                traceback=getattr(view, "traceback", None)
                or (getattr(failure, "traceback", None) if launcher else None),
                signal=failure.signal if launcher else None,
                exit_code=failure.exit_code if launcher else None,
            )
        )
    return ends


def crash_cause(ends: list[RankEnd], launcher_rank: int | None = None) -> RankEnd:
    """The failed rank that is the cause among ``ends`` (not empty; see :func:`diagnose_crash`):
    a rank that died without reporting (killed) and that the launcher names first; otherwise
    the earliest rank whose error is not one a lost peer produces; otherwise the earliest."""
    by_rank = {e.rank: e for e in ends}
    primaries = [e for e in ends if not e.consequence_like]
    timed = sorted((e for e in primaries if e.t is not None), key=lambda e: (e.t, e.rank))
    untimed = [e for e in primaries if e.t is None]
    if launcher_rank in by_rank and by_rank[launcher_rank] in untimed:
        return by_rank[launcher_rank]
    if timed:
        return timed[0]
    if untimed:
        return untimed[0]
    if launcher_rank in by_rank:
        return by_rank[launcher_rank]
    return min(ends, key=lambda e: (e.t is None, e.t or 0.0, e.rank))


def diagnose_crash(
    ends: list[RankEnd],
    launcher_rank: int | None = None,
    memory: MemoryState | None = None,
    rss: Mapping[int, int] | None = None,
    t: float = 0.0,
    desync: tuple[int, str] | None = None,
) -> list[Diagnosis]:
    """The root cause of a failed run: the first rank to fail (``crash``, or ``oom`` for a
    likely out-of-memory kill) and the ranks that failed after it as ``consequence``.

    ``desync``: (rank, ``all_reduce #17``) when the ranks' traces show that rank called a
    collective differently (torch's analyzer). Then the desync is the cause and every
    failure a consequence of it, the first included: gloo aborts the rank that receives
    more bytes than it expects, which is as often the innocent one.

    ``ends``: the failed ranks (:func:`rank_ends`); ``launcher_rank``: the first failure the
    launcher saw; ``memory``: pressure around the failure; ``rss``: rank -> last resident
    memory in bytes (from the monitor). A rank that died without reporting (killed) and that
    the launcher names first is the cause; otherwise the earliest rank whose error is not one
    a lost peer produces; otherwise the earliest.
    """
    if not ends:
        return []
    if desync is not None:
        culprit, what = desync
        return [
            Diagnosis(
                end.rank,
                "consequence",
                f"rank {end.rank} failed "
                f"({f'killed by {end.signal}' if end.signal else _error_line(end)}) after "
                + ("its own" if end.rank == culprit else f"rank {culprit}'s")
                + f" desync in {what}: a consequence, not a cause",
                t,
            )
            for end in sorted(ends, key=lambda e: e.rank)
        ]
    primaries = [e for e in ends if not e.consequence_like]
    # Every rank reporting one error that reads like a lost peer's (rasbt's DDP script asks
    # for NCCL on a host without CUDA: "nccl2 requires at least one CUDA device" on both) is
    # no evidence that one caused the other: none is named the cause.
    alike = not primaries and len(ends) > 1 and _one_reported_error(ends)
    if alike:
        primaries = list(ends)
    cause = crash_cause(ends, launcher_rank)
    first = _cause_diagnosis(cause, memory, rss, t)
    line = _error_line(cause)
    # A rank that failed with an error of its own (not one a lost peer produces) is its own
    # failure, never a consequence: the same bug hitting two ranks is two failures.
    own = [e for e in primaries if e is not cause]
    same = [e for e in own if not e.killed and not cause.killed and _error_line(e) == line]
    if same:
        ranks = sorted([cause.rank, *(e.rank for e in same)])  # "ranks 1 and 0" read oddly
        names = ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"
        first = Diagnosis(
            cause.rank, "crash", f"ranks {names} failed with the same error: {line}", t
        )
    out = [first]
    for end in own:
        # the same error: named once, in the line above (DeiT's ImportError, two ranks, had
        # its 150 characters printed twice)
        if alike:  # what no evidence says: whose code, or whose consequence
            detail = f"rank {end.rank} failed with the same error as rank {cause.rank}"
        elif end in same:
            detail = (
                f"rank {end.rank} failed in its own code with the same error as rank "
                f"{cause.rank} (not a consequence)"
            )
        else:
            detail = (
                f"rank {end.rank} also failed on its own (not a consequence): {_error_line(end)}"
            )
        out.append(Diagnosis(end.rank, "crash", detail, t))
    for end in ends:
        if end is cause or end in own:
            continue
        out.append(
            Diagnosis(
                end.rank,
                "consequence",
                f"rank {end.rank} failed after rank {cause.rank} ({_error_line(end)}): a "
                f"consequence of rank {cause.rank}'s failure, not a cause",
                t,
            )
        )
    return out


def _one_reported_error(ends: list[RankEnd]) -> bool:
    """Every one of ``ends`` reported an error (none was signalled or killed) and it reads
    the same in one line on all."""
    if any(e.signal or e.killed or not (e.error or e.traceback) for e in ends):
        return False
    return len({_error_line(e) for e in ends}) == 1


def _cause_diagnosis(
    end: RankEnd, memory: MemoryState | None, rss: Mapping[int, int] | None, t: float
) -> Diagnosis:
    last_rss = None if rss is None else rss.get(end.rank)
    rss_text = (
        f"; last RSS {_bytes(last_rss)}"
        if isinstance(last_rss, int) and not isinstance(last_rss, bool) and last_rss >= 0
        else ""
    )
    if end.killed:
        full = memory.nearly_full() if memory is not None else None
        if full:
            return Diagnosis(
                end.rank,
                "oom",
                f"rank {end.rank} was killed by SIGKILL while {full}: likely out of memory"
                f"{rss_text}",
                t,
            )
        return Diagnosis(
            end.rank,
            "crash",
            f"rank {end.rank} failed first: killed by SIGKILL (not by ddptui; memory was not "
            f"seen near its limit){rss_text}",
            t,
        )
    how = "failed first" if not end.consequence_like else "failed first (no other cause seen)"
    tb = " (traceback in the failure)" if end.traceback else ""
    return Diagnosis(end.rank, "crash", f"rank {end.rank} {how}: {_error_line(end)}{tb}", t)


#: argparse's word for a required option the script was not given, when it is a local rank.
_LOCAL_RANK_REQUIRED = re.compile(
    r"the following arguments are required:.*?(?<![\w-])(--?local[_-]rank)\b", re.I
)


def local_rank_hint(lines: Iterable[str]) -> str | None:
    """What to add to a crash whose log (``lines``, its last ones) ends in argparse's refusal
    of a missing local-rank option: the script takes its local rank as an argument, as
    ``python -m torch.distributed.launch`` passed it (``--local-rank-arg``); None otherwise."""
    for line in lines:
        found = _LOCAL_RANK_REQUIRED.search(line)
        if found:
            flag = found.group(1)
            return (
                f"the script takes its local rank as an argument ({flag}), as python -m "
                f"torch.distributed.launch passed it: {_add_local_rank_arg(flag)}"
            )
    return None


def _add_local_rank_arg(flag: str) -> str:
    """How to give a script its local rank as ``flag`` (the option and the form's field)."""
    given = "--local-rank-arg" + ("" if flag == "--local_rank" else f"={flag}")
    return f"add {given} (the form's local rank arg: {flag})"


def local_rank_read_hint(
    reads: Mapping[int, tuple[int | None, int, bool]], rank: int | None
) -> str | None:
    """What to add to a failed run's crash where a rank's script has a local-rank option that
    torchrun did not pass and that read other than its ``LOCAL_RANK`` (``reads``: rank ->
    the value read, None for its default; its LOCAL_RANK; spelled ``--local-rank``): the
    failed ``rank``'s own, else the lowest rank's. MONAI's ``unet_training_ddp.py`` read None
    on every rank, sent its output and errors to ``os.devnull`` as a secondary rank would,
    and failed on an empty loader (``ZeroDivisionError``). None without one."""
    if not reads:
        return None
    who = rank if rank in reads else min(reads)
    read, local_rank, dashed = reads[who]
    flag = "--local-rank" if dashed else "--local_rank"
    value = "kept its default" if read is None else f"read {read}"
    return (
        f"rank {who}'s script has a {flag} option that no launcher passed it (python -m "
        f"torch.distributed.launch did; torchrun does not): it {value} where the rank's "
        f"LOCAL_RANK is {local_rank}; {_add_local_rank_arg(flag)}"
    )


# -- notes -------------------------------------------------------------------------------------
_ORDINALS = {2: "a second", 3: "a third", 4: "a fourth"}


def note_diagnosis(note: Any, t: float) -> Diagnosis | None:
    """The diagnosis a note (``RunState.notes``' ``NoteSeen``) stands for, naming the first
    rank that sent it; None for a code this version cannot word."""
    if note.code == "sampler_epoch":
        passes = note.passes
        if passes in _ORDINALS:
            which = f"{_ORDINALS[passes]} pass"
        else:
            which = f"pass {passes}" if passes else "another pass"
        at = f" at epoch {note.epoch}" if note.epoch is not None else ""
        return Diagnosis(
            note.rank,
            "sampler",
            f"rank {note.rank}: DistributedSampler started {which}{at} without "
            "set_epoch(): every epoch shuffles in the same order; call "
            "sampler.set_epoch(epoch) before each epoch",
            t,
        )
    if note.code == "loader_restart" and note.seconds is not None:
        workers = f"its {counted(note.workers, 'worker')}" if note.workers else "its workers"
        which = f"pass {note.passes}" if note.passes else "a pass"
        return Diagnosis(
            note.rank,
            "loader_restart",
            f"rank {note.rank}: {which} over its training DataLoader waited "
            f"{note.seconds} s for its first batch, {workers} starting again (every pass "
            "starts them anew); DataLoader(..., persistent_workers=True) keeps them between "
            "passes",
            t,
        )
    if note.code == "summed_loss":
        ranks = note.group[1]
        return Diagnosis(
            note.rank,
            "summed_loss",
            f"each rank's loss is shown times {ranks}: FSDP sums the gradients over {ranks} "
            "ranks (set_gradient_divide_factor(1.0)), so the script made a rank's loss its "
            "share of theirs (divided by all the ranks' tokens or samples); the ranks' mean "
            "is the script's loss",
            t,
        )
    if note.code == "instrument_off":
        return Diagnosis(
            note.rank,
            "instrumentation",
            f"rank {note.rank}: ddptui's step instrumentation turned itself off after an "
            "internal error (the error is in the rank's log): the rank trains on, but its "
            "steps, samples and phases stop here; a bug of ddptui's, please report it "
            "(--no-instrument runs without the hooks)",
            t,
        )
    if note.code == "accelerate_alone":
        return Diagnosis(
            note.rank,
            "alone",
            f"rank {note.rank}: HF accelerate runs it as a process of its own "
            "(DistributedType.NO) though it joined the run's process group: accelerate wraps "
            "no DistributedDataParallel and shards no data, so each rank trains the whole "
            "dataset alone; where it finds no GPU, accelerate must be told to use the CPU "
            "(ACCELERATE_USE_CPU=true, as accelerate launch --cpu sets it, or "
            "Accelerator(cpu=True))",
            t,
        )
    if note.code == "own_group":
        group_rank, group_size = note.group
        formed = (
            f"as rank {group_rank} of {group_size}"
            if group_rank is not None and group_size is not None
            else "of another size"
        )
        where = (
            "a Slurm job's SLURM_PROCID and SLURM_NNODES are in its environment, which "
            "scripts made for srun read before torchrun's RANK and WORLD_SIZE; run it "
            "without them (env -u SLURM_JOB_ID -u SLURM_PROCID …) or as the script expects"
            if note.slurm
            else "the script takes its rank and world size from elsewhere than torchrun's "
            "RANK and WORLD_SIZE: its own flags or defaults?"
        )
        return Diagnosis(
            note.rank,
            "own_group",
            f"rank {note.rank} formed its process group {formed}, not in the world of the "
            f"ranks ddptui launched: the ranks do not train together ({where})",
            t,
        )
    return None


#: Steps every rank must have made between beats that saw its Flight Recorder progress stand
#: still before the ranks are said to train apart. Data-parallel training exchanges gradients
#: every step (DDP, FSDP, a script's own all_reduce); local SGD averages every few steps, and
#: a rank-0-only probe's optimizer steps leave the other ranks out: every rank, many steps.
NO_COMM_STEPS = 50


def no_comm_diagnosis(state: Any, t: float) -> Diagnosis | None:
    """The ranks train apart: a run of several ranks whose every rank that stepped made
    :data:`NO_COMM_STEPS` steps or more with no collective started on any process group, by
    the Flight Recorder progress its beats carry (pytorch/examples' ImageNet script makes no
    DDP module on the CPU: each rank trained its own model, and nothing said so). Evidence
    only: ranks whose beats carry no progress (no Flight Recorder) are never said to, nor a
    run whose ranks call point-to-point ops (the ``p2p`` note), which that progress does not
    count (gloo's recorder keeps none)."""
    views = [v for v in state.ranks.values() if v.step > 0]
    if len(state.ranks) < 2 or len(views) < 2:
        return None
    if "p2p" in getattr(state, "notes", {}):
        return None  # point-to-point ops pass beside the collective progress (a pipeline)
    if any(v.steps_without_comm < NO_COMM_STEPS for v in views):
        return None
    first = min(views, key=lambda v: v.rank)
    least = min(v.steps_without_comm for v in views)
    return Diagnosis(
        first.rank,
        "no_comm",
        f"every rank trained {least} steps in a row or more with no collective at all (by "
        "its Flight Recorder): the ranks exchange no gradients, so each trains a model of "
        "its own (is the model wrapped in DistributedDataParallel on this device?)",
        t,
    )


def alone_diagnosis(state: Any, t: float) -> Diagnosis | None:
    """Every rank of a world of several took its first training step with no process group
    (their ``alone`` notes): each trains by itself, on a model of its own. opacus's
    ``examples/cifar10.py`` forms its group only when given ``--local_rank``: under torchrun,
    which passes none, 2 ranks each trained the whole dataset alone and the run read
    "finished". Where a rank's ``--local_rank`` option read other than its LOCAL_RANK, that is
    the hint; else what to look for. Evidence only: a rank that formed its group after all
    takes its note back."""
    world = _whole_world(state, getattr(state, "alone", ()))
    if world is None:
        return None
    who, none = (
        (_every_rank(world) + " each", "neither") if world == 2 else (_every_rank(world), "none")
    )
    hint = local_rank_read_hint(getattr(state, "local_rank_reads", {}), None) or (
        "does the script form it only when given a flag, or a variable torchrun does not set?"
    )
    return Diagnosis(
        min(state.ranks),
        "alone",
        f"{who} train alone: {none} formed a process group (torch.distributed."
        f"init_process_group) before its first step, so this is {world} separate trainings, "
        f"not one DDP run; {hint}",
        t,
    )


def same_batches_diagnosis(state: Any, t: float) -> Diagnosis | None:
    """Every rank of a world of several trains from a DataLoader with no DistributedSampler
    and drew the same first batch (their ``first_batch`` notes' digests): each rank trains
    on the whole dataset in the same order, the same gradients on every rank, so the run does
    one rank's work (kubeflow's PyTorch MNIST example: ``shuffle=True``, one seed on every
    rank). Evidence only: ranks seeded apart draw other batches and are never said to, nor
    ranks that shard their data themselves."""
    batches = getattr(state, "first_batches", {})
    world = _whole_world(state, batches)
    if world is None or len(set(batches.values())) != 1:
        return None
    return Diagnosis(
        min(state.ranks),
        "same_batches",
        f"{_every_rank(world)} drew the same first batch from a DataLoader with no "
        "DistributedSampler: each trains on the whole dataset in the same order, so the ranks "
        f"compute the same gradients and {world} do the work of one; "
        "DistributedSampler(dataset) gives each rank its share (and sampler.set_epoch(epoch) "
        "a new order each epoch)",
        t,
    )


def _whole_world(state: Any, saying: Collection[int]) -> int | None:
    """The run's world size where it is of several and ``saying`` (ranks that sent a note)
    is every rank of it; else None."""
    ranks = getattr(state, "ranks", {})
    if len(ranks) < 2 or len(ranks) != state.world_size or set(saying) != set(ranks):
        return None
    return len(ranks)


def _every_rank(world: int) -> str:
    """Every rank of a world of ``world`` ranks, in words."""
    if world == 1:
        return "rank 0"
    return "ranks 0 and 1" if world == 2 else f"all {world} ranks"


#: What a script that spawns its own ranks does, and how to launch it (the spawners note's and
#: the failure's hint's words).
_OWN_RANKS = (
    "the script starts its ranks itself (mp.spawn, a Process per rank), as under python script.py"
)
_ONE_A_NODE = (
    "launch it as one process a node (--world-size 1; --nproc-per-node 1 on several nodes)"
)


def spawners_diagnosis(state: Any, t: float) -> Diagnosis | None:
    """More than one process ddptui launched on a node spawned workers of its own
    (``mp.spawn``, a ``Process`` per rank): the script starts its ranks itself, as under
    ``python script.py``, once a node, and each launched copy started a whole set
    (yangkky/distributed_tutorial's ``mnist-distributed.py`` at ddptui's default of 2 ranks:
    the second copy's workers failed to listen on the script's port 8888, and the run failed
    naming rank 0's lost peer). Evidence only: the ranks' own ``spawned`` notes."""
    by_node: dict[int | None, dict[int, int]] = {}
    for (node, rank), workers in getattr(state, "spawners", {}).items():
        by_node.setdefault(node, {})[rank] = workers
    for node in sorted(by_node, key=lambda n: -1 if n is None else n):
        ranks = by_node[node]
        if len(ranks) < 2:
            continue
        counts = sorted(set(ranks.values()))
        each = f"{counts[0]} each" if len(counts) == 1 else "each"
        on = "" if node is None else f" on node {node}"
        return Diagnosis(
            min(ranks),
            "spawners",
            f"{ranks_text(ranks)}{on} spawned workers of their own ({each}): {_OWN_RANKS}; "
            f"{_ONE_A_NODE}",
            t,
        )
    return None


def spawner_hint(spawners: Mapping[tuple[int | None, int], int], per_node: int) -> str | None:
    """What to add to a failed run's crash where a process ddptui launched, one of several a
    node (``per_node``), spawned workers of its own, but no second one had said so (then
    :func:`spawners_diagnosis` does): the copies start whole sets that may fail before they
    spawn. NVlabs/stylegan3's ``train.py --gpus=2`` at ddptui's default of 2: the second copy
    failed making the output directory the first had just made (``FileExistsError``), and
    nothing said why. ``spawners``: (node, rank) -> workers. None otherwise."""
    if per_node < 2 or not spawners:
        return None
    nodes = [node for node, _ in spawners]
    if len(set(nodes)) < len(nodes):
        return None  # two of a node said so: the spawners diagnosis did
    (_, rank), workers = min(spawners.items(), key=lambda item: item[0][1])
    return (
        f"rank {rank} spawned {workers} workers of its own: {_OWN_RANKS}, and ddptui launched "
        f"{per_node} copies of it a node, each to start a whole set; {_ONE_A_NODE}"
    )


# -- summary.json -------------------------------------------------------------------------------
#: Longest stack text kept per rank in summary.json.
MAX_STACK_TEXT = 20_000
#: Most diagnoses kept in summary.json.
MAX_DIAGNOSES = 100


def diagnoses_for_summary(
    diagnoses: Iterable[Diagnosis], stacks: Mapping[int, str] | None = None
) -> dict[str, Any]:
    """The ``diagnoses`` (and, after a hang, ``stacks``: rank -> text) of summary.json."""
    docs = [d.to_json() for d in diagnoses][:MAX_DIAGNOSES]
    for doc in docs:
        t = doc["t"]
        doc["t"] = round(float(t), 3) if isinstance(t, int | float) and t == t else None
        if doc["t"] is not None and abs(doc["t"]) == float("inf"):
            doc["t"] = None
    out: dict[str, Any] = {"diagnoses": docs}
    if stacks:
        out["stacks"] = {
            str(rank): text if len(text) <= MAX_STACK_TEXT else text[:MAX_STACK_TEXT] + "\n…"
            for rank, text in sorted(stacks.items())
        }
    return out


# -- the run's own record ------------------------------------------------------------------------
#: events.jsonl growing faster than this (bytes a second) over :data:`GROWTH_WINDOW_S` is said,
#: once: 1.8 GiB an hour. Every step is a line of about 470 bytes on every rank, and a script
#: of millisecond steps writes megabytes a second (two ranks of 1.2 ms CPU steps: 18.7 MB in
#: 26 s); a full disk under the run directory stops the run.
GROWTH_NOTE_BYTES_S = 512 * 1024
GROWTH_WINDOW_S = 30.0


def counter_rate(samples: Sequence[tuple[float, float]], window: float) -> float | None:
    """How fast a count that only grows (bytes moved, a file's size) moved: per second, over
    its ``(time, count)`` samples of the last ``window`` seconds counted back from the newest;
    None without two samples at different times there."""
    if len(samples) < 2:
        return None
    last_at, last = samples[-1]
    first_at, first = next((s for s in samples if s[0] >= last_at - window), samples[-1])
    if last_at <= first_at:
        return None
    return max(0, last - first) / (last_at - first_at)


class GrowthWatch:
    """How fast a file grows: its size sampled now and then; :meth:`sample` returns bytes a
    second over the last ``window`` seconds once that much has been watched, else None."""

    def __init__(self, window: float = GROWTH_WINDOW_S) -> None:
        self.window = window
        self._marks: deque[tuple[float, int]] = deque()

    def sample(self, now: float, size: int) -> float | None:
        marks = self._marks
        marks.append((now, size))
        while now - marks[0][0] > self.window:
            marks.popleft()
        if now - marks[0][0] < 0.9 * self.window:
            return None
        return counter_rate(marks, self.window)


def growth_diagnosis(rate: float, free: int | None, t: float) -> Diagnosis:
    """The note for an events.jsonl growing ``rate`` bytes a second, with ``free`` bytes left
    on its disk (None: not known)."""
    mib, gib = 2.0**20, 2.0**30
    left = ""
    if free is not None:
        hours = free / rate / 3600
        left = f"; {free / gib:,.1f} GiB free under the run directory: about {hours:,.1f} h"
    return Diagnosis(
        None,
        "record_growth",
        f"events.jsonl grows {rate / mib:,.1f} MiB a second ({rate * 3600 / gib:,.1f} GiB an "
        f"hour; a line an event){left}, and a full disk stops the run. Fewer, longer "
        "steps, or ddptui.log every Nth step (its calls replace the hooks' steps), keep it small",
        t,
    )


def data_parallel_diagnosis(state: Any, t: float) -> Diagnosis | None:
    """The note for a run whose gradients are synchronized over fewer ranks than its world
    (``RunState.data_parallel``): the others share their batches, counted once."""
    dp, world = state.data_parallel, state.world_size
    if not dp or dp >= world:
        return None
    shared = world / dp
    each = f"{shared:g}" if shared == int(shared) else f"{shared:.1f}"
    return Diagnosis(
        None,
        "data_parallel",
        f"each batch is trained on by {each} ranks (tensor, pipeline or context parallel; "
        f"data parallel over {dp} of {world}): the run's samples and samples/s count it "
        "once; each rank's row shows its own",
        t,
    )


def own_error_diagnosis(what: str, exc: BaseException, t: float) -> Diagnosis:
    """The note for ddptui's own error while ``what`` (``diagnosis``: deciding stragglers and
    hangs; ``events``: applying an event to the run's state), with where it was raised."""
    raised = traceback.extract_tb(exc.__traceback__)[-1:]  # the innermost frame
    where = "".join(f" at {f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in raised)
    error = f"{type(exc).__name__}: {exc}"[:300]
    after = (
        "no straggler or hang verdict is made for the rest of this run, and none stops it"
        if what == "diagnosis"
        else "the event is kept in events.jsonl; the others still count"
    )
    doing = "diagnosing the run" if what == "diagnosis" else "applying an event"
    return Diagnosis(
        None,
        "own_error",
        f"ddptui's own error while {doing} ({error}{where}): the run goes on; {after}. "
        "Please report it",
        t,
    )


#: Processes a lingering note names (the rest counted).
MAX_LINGERING_NAMED = 6


def lingering_diagnosis(
    world: int, since: float, processes: list[tuple[int, str]], t: float, hint: str | None = None
) -> Diagnosis | None:
    """Every one of the ``world`` ranks finished ``since`` seconds ago, and ``processes``
    (``(pid, what)``) of the run still run: a process the script started that never formed
    the run's process group reports nothing, and the launcher waits for it as plain torchrun
    would. facebookresearch/ijepa's ``main.py`` (a ``Process`` per device) at ddptui's default
    of 2: each launched copy started a whole set on the script's fixed port, one set trained
    to its end, and a worker of the other waited in its rendezvous, the run's last line
    unchanged for minutes and nothing said. ``hint``: :func:`spawner_hint`'s words, added.
    None without processes."""
    if not processes:
        return None
    named = ", ".join(f"pid {pid} ({what})" for pid, what in processes[:MAX_LINGERING_NAMED])
    more = len(processes) - MAX_LINGERING_NAMED
    if more > 0:
        named += f" and {counted(more, 'more')}"
    return Diagnosis(
        None,
        "lingering",
        f"{_every_rank(world)} finished {since:.0f} s ago, but "
        f"{counted(len(processes), 'process', 'processes')} of the run are still running: {named}; "
        "a process the script started that formed no process group with the ranks reports "
        "nothing, and the run ends when its launcher does (Ctrl-C stops it)"
        + (f"; {hint}" if hint else ""),
        t,
    )


# -- the running judgement -----------------------------------------------------------------------
#: Consecutive checks a straggler finding must hold before it is reported.
CONFIRM_CHECKS = 3


class Diagnoser:
    """The live judgement of a run: call :meth:`check` now and then (say once a second) with
    the run's state; it returns what is newly found. Pure (the caller supplies ``now``)."""

    def __init__(self, hang_timeout: float | None = None, confirm: int = CONFIRM_CHECKS) -> None:
        self.hang_timeout = hang_timeout
        self.confirm = max(1, confirm)
        self.diagnoses: list[Diagnosis] = []
        #: The hang found (the first one), with the ranks and how long they were quiet.
        self.hang: Diagnosis | None = None
        self.hung: dict[int, float] = {}
        #: The evidence behind the hang, per stuck rank.
        self.stuck: dict[int, Stuck] = {}
        self.limit: float | None = None
        self._candidate: tuple[int | None, str] | None = None
        self._held = 0
        self._reported: tuple[int | None, str] | None = None
        #: The note codes already turned into diagnoses (``no_comm`` too, once said).
        self._noted: set[str] = set()
        self._waited = False  # ranks were seen waiting past the limit for ranks at work

    def record(self, diagnosis: Diagnosis) -> None:
        if len(self.diagnoses) < MAX_DIAGNOSES:
            self.diagnoses.append(diagnosis)

    def notes(self, state: Any) -> list[Diagnosis]:
        """The notes the ranks sent that were not said yet, one diagnosis per code (recorded);
        ``t`` is when the first one arrived. And, once each, the notes the ranks make
        together: they train apart (:func:`no_comm_diagnosis`), on the same data
        (:func:`same_batches_diagnosis`), each alone (:func:`alone_diagnosis`), several
        launched processes spawned workers (:func:`spawners_diagnosis`)."""
        found: list[Diagnosis] = []
        for code, note in getattr(state, "notes", {}).items():
            if code in self._noted:
                continue
            self._noted.add(code)
            start = state.started_at
            diagnosis = note_diagnosis(note, max(0.0, note.t - start) if start is not None else 0.0)
            if diagnosis is not None:
                self.record(diagnosis)
                found.append(diagnosis)
        together = (  # the notes the ranks make together, each said once
            ("no_comm", bool(getattr(state, "ranks", None)), no_comm_diagnosis),
            ("same_batches", bool(getattr(state, "first_batches", None)), same_batches_diagnosis),
            ("alone", bool(getattr(state, "alone", None)), alone_diagnosis),
            ("spawners", len(getattr(state, "spawners", ())) > 1, spawners_diagnosis),
            ("data_parallel", bool(getattr(state, "data_parallel", None)), data_parallel_diagnosis),
        )
        for code, evidence, judge in together:
            if code in self._noted or not evidence:
                continue
            said = judge(state, state.elapsed(state.last_event_at or 0.0))
            if said is not None:
                self._noted.add(code)
                self.record(said)
                found.append(said)
        return found

    def check(
        self,
        state: Any,
        now: float,
        cpu_percent: Mapping[int, float] | None = None,
        recent_cpu: Mapping[int, float] | None = None,
        recent_io: Mapping[int, float] | None = None,
    ) -> list[Diagnosis]:
        """What this second's state shows. ``cpu_percent``: each rank's CPU by ddptui's own
        sample over :data:`ddptui.run.probe.WINDOW_S` (the straggler rule's); ``recent_cpu``
        and ``recent_io`` (bytes a second): over the last :data:`RECENT_CPU_S`, what a rank
        whose beats stopped does now: busy or moving data, it works; idle, it is stuck once
        it stood still for the limit (``cpu_percent`` when not given)."""
        found = self.notes(state)  # notes are no verdicts: they never change the ones below
        if state.outcome:
            return found
        t = state.elapsed(now)
        # A straggler verdict stands on steps that still come: a rank paused (hung, or waiting
        # for rank 0's evaluation) is not judged on the medians of steps it made before, nor
        # are the others against it. Such a rank was once named a compute straggler from its
        # old steps while it hung, before the hang verdict said what it was.
        live = [r for r, v in state.ranks.items() if v.state == "started" and v.stepping_at(now)]
        history = getattr(state, "phase_history", None)
        # every judged rank steps, so its CPU reading is its steps' (see stepping_cpu)
        finding = find_straggler(history, live, cpu_percent, t=t) if history is not None else None
        key = None if finding is None else (finding.rank, finding.cause)
        if key == self._candidate:
            self._held += 1
        else:
            self._candidate, self._held = key, 1
        if self._held >= self.confirm and key != self._reported:
            self._reported = key
            if finding is not None:
                self.record(finding)
                found.append(finding)
        if self.hang is None:
            limit = hang_limit(state, self.hang_timeout)
            before = prepare_limit(limit, self.hang_timeout)
            recent = cpu_percent if recent_cpu is None else recent_cpu
            stuck = stuck_ranks(state, now, limit, before, recent, io_rate=recent_io)
            working = working_ranks(state, now, stuck, recent, io_rate=recent_io) if stuck else []
            if stuck and working and limit is not None:
                # Not a hang while a rank works: the stuck ones wait for it (said once).
                if not self._waited:
                    self._waited = True
                    waiting = Diagnosis(None, "waiting", _waiting_detail(state, stuck, working), t)
                    self.record(waiting)
                    found.append(waiting)
            elif stuck and limit is not None:
                stepped = any(state.ranks[rank].step > 0 for rank in stuck)
                self.limit = limit if stepped else (before or limit)
                self.stuck = stuck
                self.hung = {rank: s.seconds for rank, s in stuck.items()}
                self.hang = Diagnosis(
                    None,
                    "hang",
                    "; ".join(s.describe() for s in stuck.values()) + f" (limit {self.limit:g} s)",
                    t,
                )
                found.append(self.hang)
        return found

    def final(
        self, state: Any, now: float, cpu_percent: Mapping[int, float] | None = None
    ) -> list[Diagnosis]:
        """At the end of the run: the straggler verdict over every rank's last steps, when it
        was not reported yet (a short run ends before a finding can hold); and the notes that
        arrived since the last check."""
        found = self.notes(state)
        history = getattr(state, "phase_history", None)
        if history is None:
            return found
        # Unconfirmed by the live checks, it must stand on a full window of every rank's
        # steps: the medians of a few steps on shared cores are scheduling noise.
        full = [r for r in history.ranks() if history.steps(r) >= history.window]
        cpu = stepping_cpu(state, cpu_percent, now)
        finding = find_straggler(history, full, cpu, t=state.elapsed(now))
        if finding is None or (finding.rank, finding.cause) == self._reported:
            return found
        self._reported = (finding.rank, finding.cause)
        self.record(finding)
        return [*found, finding]

    def explain_hang(
        self, stacks: Mapping[int, str], t: float, no_ddp: Collection[int] = ()
    ) -> list[Diagnosis]:
        """After a hang: the culprit and the waiting ranks from their stacks (recorded);
        ``no_ddp``: the ranks whose beats say they hold no DDP module."""
        found = diagnose_hang(self.hung, stacks, self.limit or 0.0, t, no_ddp)
        for diagnosis in found:
            self.record(diagnosis)
        return found
