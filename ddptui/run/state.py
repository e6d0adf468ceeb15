"""RunState: everything known about a run, built only from events. Pure: no I/O, no clocks.

Both front ends (headless and the dashboard) and replay read the same RunState. The caller
supplies ``now`` (any monotonic-ish clock, used consistently) to :meth:`RunState.apply` and
to the queries that depend on time; replay uses the events' own ``t``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from ddptui import protocol
from ddptui.formatting import error_summary
from ddptui.run.diagnosis import IDLE_IO_BYTES_PER_S, PhaseHistory

#: Points kept per series (loss, throughput, step time) per rank.
SERIES_LENGTH = 2_000
#: Most evaluations kept (the oldest go first): a script evaluating every few steps for days,
#: or a forged stream of ``eval`` events, does not grow the state without end.
MAX_EVALS = 2_000
#: Most (rank, attempt, epoch) whose evaluations are counted (see :class:`EvalIndex`).
MAX_EVAL_COUNTS = 100_000
#: A rank whose recent step time exceeds this multiple of the ranks' median is a straggler.
STRAGGLER_FACTOR = 1.5
#: Step times a rank must have in its window before its typical one is compared: a first step
#: alone (warm-up, a wait for the slower ranks to reach theirs) is no rank's pace.
STRAGGLER_MIN_STEPS = 3
#: A running rank silent for this many expected step intervals (and MIN_SILENT_S) is silent.
SILENT_INTERVALS = 10
MIN_SILENT_S = 5.0
#: Before its first step a rank is loading data and joining the process group: allow more.
STARTUP_SILENT_S = 60.0
_RECENT = 10  # steps in the rolling step-time window
#: A rank's throughput is its latest step's rate while its steps keep coming: until this many
#: of its typical step times (and at least :data:`RATE_GRACE_S`) have passed since its last
#: step arrived (steps arrive in batches, and a refresh falls anywhere between two)...
RATE_GRACE_STEPS = 3.0
RATE_GRACE_S = 2.0
#: ...and the rate of its steps is read over those that arrived in the last this many seconds
#: (before the latest's arrival; at most :data:`RATE_WINDOW_STEPS` of them): their samples over
#: their time. One step's own rate swings with its time, and millisecond steps swing by
#: twice: two ranks of 1.2 ms CPU steps, 12,300 samples/s between them, showed 12,937 to
#: 23,892 from one refresh to the next (and 3,612 once), each the sum of two steps' rates;
#: over their last 64 steps (80 ms), 10,000 to 17,400.
RATE_WINDOW_S = 2.0
RATE_WINDOW_STEPS = 2048
#: The window's sums are added to and taken from as steps come and go; recomputed from its
#: steps this often, so that rounding cannot build up over a long run, and whenever a step
#: that leaves outweighed the steps that stay (a rate of 10^12 for 10^9 s, as a forged event
#: may say, left 10^5 samples of rounding behind: 7,884 samples/s for 8,000).
_RATE_RESUM = 4096


#: Largest seq gap counted as dropped events; a bigger jump (a rank's telemetry queue holds far
#: fewer events) is a forged or corrupt seq and counts as one gap.
MAX_SEQ_GAP = 100_000


@dataclass(frozen=True)
class EvalPoint:
    epoch: int | None
    accuracy: float | None
    loss: float | None
    count: int | None
    t: float
    attempt: int = 0
    #: Which of its epoch's evaluations it is (0: the first).
    index: int = 0
    #: The rank whose figures these are (the lowest that reported them).
    rank: int | None = None


class EvalIndex:
    """Which evaluation of its epoch an ``eval`` event is, as ``(epoch, n)``: every rank
    reports the same all-reduced result (or rank 0 alone), so the n-th evaluation one rank
    reports in an epoch, in an attempt, is the n-th of every other rank. A script may evaluate
    more than once an epoch (every N steps: the HF Trainer's ``eval_steps``)."""

    def __init__(self) -> None:
        self._counts: dict[tuple[int, int, int | None], int] = {}

    def key(self, event: protocol.Eval) -> tuple[int | None, int]:
        counted = (event.rank, event.attempt, event.epoch)
        n = self._counts.get(counted, 0)
        if n == 0 and len(self._counts) >= MAX_EVAL_COUNTS:  # forged epochs: the oldest go
            del self._counts[next(iter(self._counts))]
        self._counts[counted] = n + 1
        return event.epoch, n


def eval_replaces(old_attempt: int, old_rank: int | None, attempt: int, rank: int) -> bool:
    """Whether rank ``rank``'s report of an evaluation (in ``attempt``) replaces the one kept
    (``old_rank``'s, in ``old_attempt``): a later attempt's does (after a restart), and so does
    a lower rank's in the same attempt, so that a figure not all-reduced (Lightning's
    ``self.log`` without ``sync_dist``) is rank 0's, the one the script prints and logs."""
    if attempt != old_attempt:
        return attempt > old_attempt
    return old_rank is not None and rank < old_rank


def _eval_order(key: tuple[int | None, int]) -> tuple[bool, int, int]:
    """Evaluations in training order: by epoch (those without one last), then as they came
    within it."""
    epoch, index = key
    return (epoch is None, epoch or 0, index)


@dataclass(frozen=True)
class RankFailureInfo:
    """How the run failed, from the launcher's point of view (exit code, signal, stderr)."""

    rank: int | None
    exit_code: int | None = None
    signal: str | None = None
    error: str | None = None
    stderr_tail: tuple[str, ...] = ()
    #: The failing rank's Python traceback, when it reported one.
    traceback: str | None = None
    #: The process the launcher saw fail (None: not known).
    pid: int | None = None
    #: That process was not the rank's any more: the launcher started it as ``rank``, and it
    #: started the ranks itself (mp.spawn's workers, a ``Process`` per rank), which took that
    #: rank over. Its end is the script's, not that rank's.
    spawner: bool = False

    def describe(self, short: bool = False) -> str:
        """``rank 1 exited with code 1: ValueError: x``; ``short``: the error in one line
        (:func:`ddptui.formatting.error_summary`), for a console or a panel whose log tail
        follows: a DataLoader worker's error printed its whole traceback there, then the same
        again as the log's tail."""
        if self.spawner:
            who = f"the script's process (launched as rank {self.rank}; its workers were the ranks)"
        else:
            who = f"rank {self.rank}" if self.rank is not None else "the launcher"
        if self.signal:
            how = f"was killed by signal {self.signal}"
        elif self.exit_code is not None:
            how = f"exited with code {self.exit_code}"
        else:
            how = "failed"
        error = error_summary(self.error) if self.error and short else self.error
        return f"{who} {how}" + (f": {error}" if error else "")


@dataclass
class NoteSeen:
    """A note (``protocol.Note``) as the run first heard it."""

    code: str
    rank: int  # the first rank that sent it
    epoch: int | None
    passes: int | None
    t: float  # when it arrived (the caller's clock, like ``RunState.started_at``)
    #: ``own_group``: the group the rank formed (its rank in it, its size), and whether a
    #: Slurm job's variables were in its environment.
    group: tuple[int | None, int | None] = (None, None)
    slurm: bool = False
    #: ``loader_restart``: the DataLoader's workers, and the seconds its pass waited for them.
    workers: int | None = None
    seconds: int | None = None


@dataclass
class AttemptRecord:
    """One attempt of a run (``--max-restarts``): when it began, where from, how it ended."""

    attempt: int
    started_at: float  # wall clock, seconds since the epoch
    resumed_from: str | None = None  # the checkpoint it resumed from
    resumed_from_epoch: int | None = None
    outcome: str | None = None  # None while it runs; then failed / finished / stopped / …
    failure: RankFailureInfo | None = None
    #: Cumulative step (the charts' x) at which this attempt began, per the fastest rank.
    first_step: int = 0


@dataclass(slots=True)
class RankView:
    """Latest values and bounded history for one rank."""

    rank: int
    state: str = "pending"  # pending | started | finished | failed | stopped
    pid: int | None = None
    host: str | None = None
    #: Node rank in a multi-node run (from the rank's ``started`` Status), None when unknown.
    node: int | None = None
    local_rank: int | None = None
    device: str | None = None
    device_uuid: str | None = None
    error: str | None = None
    traceback: str | None = None
    epoch: int | None = None
    step: int = 0
    steps_in_epoch: int = 0
    loss: float | None = None
    samples_total: int = 0
    samples_per_s: float | None = None
    step_time: float | None = None
    #: The steps that said how long they took: their samples, their time and how many they
    #: were, summed over the run (every attempt), for the rank's mean rate and step time once
    #: the run has ended.
    samples_timed: int = 0
    time_stepping: float = 0.0
    steps_timed: int = 0
    #: Of those, each attempt's first timed step (its warm-up: CUDA's context, cuDNN's
    #: autotuning, torch.compile's compilation; nanoGPT compiled took 15.5 s in its first
    #: step on an H200 and 4.2 s in its 300 others): their samples and time, summed.
    first_steps_samples: int = 0
    first_steps_time: float = 0.0
    #: The attempt whose first timed step is counted there (-1: none yet).
    first_step_attempt: int = -1
    last_seen: float | None = None
    #: When its last step arrived.
    last_step_at: float | None = None
    last_seq: int = -1
    events: int = 0
    gaps: int = 0  # events missing according to seq numbers (dropped on the way)
    #: The first implausible seq jump (from, to): counted as one gap, not as that many drops.
    seq_jump: tuple[int, int] | None = None
    reporter_dropped: int = 0
    #: The last epoch this rank ended (its ``epoch_end``); None before it ended one.
    ended_epoch: int | None = None
    attempt: int = 0  # the attempt this rank's latest events came from
    step_offset: int = 0  # steps of earlier attempts (series continue across attempts)
    loss_series: deque[tuple[int, float]] = field(
        default_factory=lambda: deque(maxlen=SERIES_LENGTH)
    )
    sps_series: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=SERIES_LENGTH)
    )
    #: The pauses between two of its steps longer than the grace (see :meth:`rate_at`), as
    #: ``(start, end, rate)``: from the grace's end to the next step's arrival, then that
    #: step's rate; the throughput chart draws 0 through them, not the last rate carried.
    pauses: deque[tuple[float, float, float]] = field(
        default_factory=lambda: deque(maxlen=SERIES_LENGTH)
    )
    recent_step_times: deque[float] = field(default_factory=lambda: deque(maxlen=_RECENT))
    #: Its recent timed step events with a rate: ``(arrival, samples at that rate, seconds,
    #: steps)``, and their sums (see :meth:`note_rate`).
    rate_window: deque[tuple[float, float, float, int]] = field(default_factory=deque)
    _rate_samples: float = field(default=0.0, repr=False)
    _rate_time: float = field(default=0.0, repr=False)
    _rate_steps: int = field(default=0, repr=False)
    _rate_notes: int = field(default=0, repr=False)
    #: The latest step's phases in seconds (built-in and custom), when the rank sends them.
    phases: dict[str, float] | None = None
    # -- from the rank's heartbeat (``beat`` events) --
    #: The script's innermost frame of the main thread, ``func (file.py:line)``.
    frame: str | None = None
    #: The collective the main thread waits in, if any.
    waiting: str | None = None
    #: The last beat said the rank holds no DDP module: a ``backward()`` in its stack dump is
    #: its own work, not a wait for the gradient all-reduce (see :func:`diagnose_hang`).
    no_ddp: bool = False
    #: When the last beat arrived (None: the rank sends none).
    beat_at: float | None = None
    #: The evaluation batches the rank had run at its last beat (``Beat.evaluations``).
    evaluations: int = 0
    #: Where the rank's steps stood (:meth:`_step_mark`) at its last beat, and, when that
    #: beat found its evaluation batches grown with no step since the beat before, where
    #: they stood then (None: it did not): the rank evaluates until a step comes (see
    #: :attr:`activity`).
    _beat_mark: tuple = field(default=(0, None), repr=False)
    _evaluating_mark: tuple | None = field(default=None, repr=False)
    #: Workers this process spawned (``spawned`` note): it only waits for them, silent, until
    #: one of them announces itself under this rank (0: it spawned none).
    spawned: int = 0
    #: The process's CPU seconds at the last beat.
    cpu: float | None = None
    #: The bytes the process has read and written (files, pipes, TLS, storage) at the last beat.
    io: int | None = None
    #: How many times the thread its beats sample has slept and woken (``Beat.wakes``).
    wakes: int | None = None
    #: Since when neither the stack, the steps nor the collectives moved; the CPU seconds, I/O
    #: bytes and wakes then.
    still_since: float | None = None
    cpu_since: float | None = None
    io_since: int | None = None
    wakes_since: int | None = None
    #: Per process group and backend, the last collective started and the last completed:
    #: ``(group, op, started, completed, backend)`` (see :class:`protocol.CollectiveMark`).
    collectives: tuple = ()
    _digest: str | None = field(default=None, repr=False)
    #: The most steps the rank made between two beats whose Flight Recorder progress (the
    #: last collective started, per process group) did not move: steps with no collective at
    #: all. A rank of a data-parallel run exchanges gradients every step; one that does not
    #: trains a model of its own. Only where the beats carry that progress (silence is no
    #: evidence): ``_comm_key`` is the progress last seen moved, ``_comm_steps`` the rank's
    #: steps then.
    steps_without_comm: int = 0
    _comm_key: tuple | None = field(default=None, repr=False)
    _comm_steps: int = field(default=0, repr=False)
    #: ``typical_step_time`` and what it was computed at: the rank's events applied and the
    #: window's length. It is read for every rank several times a frame (health, the table)
    #: and once a second by the diagnosis, while the window changes only in an applied event
    #: (a step; a new attempt clears it), so an event count that moved says it may have.
    _typical: tuple[tuple[int, int], float | None] = field(
        default=((-1, -1), None), repr=False, compare=False
    )

    @property
    def activity(self) -> str:
        """The state to show: ``evaluating`` for a live rank that ran evaluation batches and
        no step between its last two beats (an evaluation pass, or a run that only evaluates:
        pytorch/examples' ImageNet ``--evaluate``), until its next step; ``preparing`` for
        one that has not stepped yet."""
        if self.state != "started":
            return self.state
        if self._evaluating_mark is not None and self._evaluating_mark == self._step_mark():
            return "evaluating"
        return "preparing" if self.step == 0 else self.state

    def _step_mark(self) -> tuple[int, float | None]:
        """Where the rank's steps stand: another step event changes it (its number, or the
        time it came)."""
        return self.step, self.last_step_at

    def note_evaluations(self, evaluations: int) -> None:
        """A beat's count of evaluation batches (see :attr:`activity`). A count that went
        back is another process's under this rank (a restart, a spawned worker): it counts
        from there."""
        mark = self._step_mark()
        grew = evaluations > self.evaluations
        self._evaluating_mark = mark if grew and mark == self._beat_mark else None
        self._beat_mark, self.evaluations = mark, evaluations

    @property
    def still_for(self) -> float | None:
        """Seconds (up to the last beat) that the stack, steps and collectives stood still."""
        if self.still_since is None or self.beat_at is None:
            return None
        return max(0.0, self.beat_at - self.still_since)

    @property
    def cpu_while_still(self) -> float | None:
        """CPU seconds the process used while it stood still (up to the last beat)."""
        return _grown(self.cpu, self.cpu_since)

    @property
    def io_while_still(self) -> int | None:
        """Storage bytes the process read or wrote while it stood still (up to the last beat)."""
        return _grown(self.io, self.io_since)

    @property
    def wakes_while_still(self) -> int | None:
        """How many times its sampled thread slept and woke while it stood still (up to the
        last beat)."""
        return _grown(self.wakes, self.wakes_since)

    def still_from(self, now: float) -> None:
        """The rank moved (a step, its stack, its collectives; or a counter that went back):
        it stands still from ``now``, its counters counted from their values now."""
        self.still_since, self.cpu_since = now, self.cpu
        self.io_since, self.wakes_since = self.io, self.wakes

    def after_first_steps(self) -> tuple[int, float]:
        """(samples, seconds) of its timed steps without each attempt's first (its warm-up)."""
        return (
            self.samples_timed - self.first_steps_samples,
            self.time_stepping - self.first_steps_time,
        )

    def rate_over_run(self) -> float | None:
        """The rank's mean samples/s over its steps: their samples over their summed step
        times (a step that held an evaluation counts with its time, but for the evaluation
        passes the hooks tell apart); its latest rate when no step said how long it took."""
        if self.samples_timed and self.time_stepping > 0.0:
            return self.samples_timed / self.time_stepping
        return self.samples_per_s

    def note_rate(self, now: float, rate: float, seconds: float, steps: int = 1) -> None:
        """A step event of ``seconds`` at ``rate`` samples/s (``steps`` steps: see
        ``protocol.Step.steps``) arrived at ``now``: into the window,
        and the steps older than :data:`RATE_WINDOW_S` before it out (a step's cost is the
        same however many the window holds: reads are a division)."""
        window = self.rate_window
        done = rate * seconds
        window.append((now, done, seconds, steps))
        samples, spent = self._rate_samples + done, self._rate_time + seconds
        counted = self._rate_steps + steps
        since = now - RATE_WINDOW_S
        if window[0][0] < since or len(window) > RATE_WINDOW_STEPS:
            lost = False  # a step left that outweighed what stays: the sums' digits went with it
            while window[0][0] < since or len(window) > RATE_WINDOW_STEPS:
                _, gone, gone_s, gone_n = window.popleft()
                samples -= gone
                spent -= gone_s
                counted -= gone_n
                lost = lost or gone > samples or gone_s > spent
            self._rate_notes += 1
            if lost or self._rate_notes >= _RATE_RESUM:  # else only rounding, slowly
                self._rate_notes = 0
                samples = sum(entry[1] for entry in window)
                spent = sum(entry[2] for entry in window)
        self._rate_samples, self._rate_time, self._rate_steps = samples, spent, counted

    def forget_rates(self) -> None:
        self.rate_window.clear()
        self._rate_samples = self._rate_time = 0.0
        self._rate_steps = 0

    def recent_rate(self) -> float | None:
        """Samples/s of its latest steps: over those that arrived within
        :data:`RATE_WINDOW_S` of the latest, their samples over their time (the latest step's
        rate where it alone arrived then, or no step said its time)."""
        if len(self.rate_window) < 2 or self._rate_time <= 0.0:
            return self.samples_per_s
        return self._rate_samples / self._rate_time

    def recent_step_time(self) -> float | None:
        """The mean time of the steps :meth:`recent_rate` reads (the latest step's where it
        alone arrived in that window): millisecond steps swing, one step's time 0.5 ms, the
        next 6.6 ms, around 1.1 ms."""
        window = self.rate_window
        if len(window) < 2 or self._rate_time <= 0.0:
            return self.step_time
        return self._rate_time / self._rate_steps  # the window's events may hold several

    def rate_at(self, now: float | None) -> float | None:
        """Samples/s at ``now``: the rate of its latest steps while they keep coming (see
        :meth:`recent_rate`); once the rank has not stepped for longer than the grace (a
        rank-0 evaluation, a checkpoint, a data stall), what it kept since: that rate over the
        last step's time plus the pause beyond the grace. 914 samples/s 20 s into an
        evaluation with 70 ms steps is 3, not 914 (``now`` None: the latest rate)."""
        rate = self.recent_rate() if self.samples_per_s else self.samples_per_s
        if not rate or now is None or not self.sps_series:
            return rate
        beyond = now - self.sps_series[-1][0] - self.rate_grace()
        if beyond <= 0.0:
            return rate
        step = self.step_time if self.step_time and self.step_time > 0.0 else 0.0
        return rate * step / (step + beyond)

    def stepping_at(self, now: float) -> bool:
        """Whether the rank still steps at ``now``: its last step arrived within the grace
        (not paused for a rank-0 evaluation, a checkpoint or a peer)."""
        last = self.last_step_at
        return last is not None and now - last <= self.rate_grace()

    def rate_grace(self) -> float:
        """How long after its last step a rank's latest rate still holds (s)."""
        return max(RATE_GRACE_STEPS * (self.typical_step_time or 0.0), RATE_GRACE_S)

    @property
    def typical_step_time(self) -> float | None:
        """The median of the recent step times (None before the first)."""
        window = self.recent_step_times
        key = (self.events, len(window))
        if key != self._typical[0]:
            self._typical = (key, statistics.median(window) if window else None)
        return self._typical[1]


def _grown(value: float | None, since: float | None) -> Any:
    """How much a counter grew since ``since`` (never less than 0); None where either is not
    known."""
    if value is None or since is None:
        return None
    return max(0, value - since)


class StepLoss:
    """The ranks' losses at one step, for their mean (the loss chart's line): the finite ones
    summed, NaNs and infinities counted, so that :meth:`mean` is what ``sum(values) /
    len(values)`` would be, and a rank's value can be replaced without the others'."""

    __slots__ = ("total", "count", "nan", "pos", "neg")

    def __init__(self) -> None:
        self.total = 0.0
        self.count = self.nan = self.pos = self.neg = 0

    def add(self, value: float, sign: int = 1) -> None:
        """Count ``value`` in (``sign`` 1) or take it out again (``sign`` -1)."""
        self.count += sign
        if value != value:
            self.nan += sign
        elif value == math.inf:
            self.pos += sign
        elif value == -math.inf:
            self.neg += sign
        else:
            self.total += sign * value

    def mean(self) -> float:
        if self.nan or (self.pos and self.neg):
            return math.nan
        if self.pos or self.neg:
            return math.inf if self.pos else -math.inf
        return self.total / self.count


#: Launched processes that spawned workers kept in :attr:`RunState.spawners` (one a node is
#: the script's way; a few more say it is launched wrongly).
MAX_SPAWNERS = 64


class RunState:
    """Apply events in arrival order; read per-rank views, global numbers and health."""

    def __init__(
        self,
        run_id: str,
        world_size: int,
        epochs: int | None = None,
        script_epochs: tuple[int, str] | None = None,
    ) -> None:
        self.run_id = run_id
        self.world_size = world_size
        self.epochs = epochs
        #: The script argument the number of epochs was read from (``--epochs``, ``argv.
        #: epochs_in_args``) when neither ddptui's ``--epochs`` nor a rank said it: a reading
        #: that a rank's word replaces and a rank stepping past it takes back.
        self.epochs_flag: str | None = None
        if not epochs and script_epochs:
            self.epochs, self.epochs_flag = script_epochs
        self.ranks: dict[int, RankView] = {r: RankView(r) for r in range(world_size)}
        #: Evaluations by (epoch, index within the epoch): see :meth:`_on_eval`.
        self.evals: dict[tuple[int | None, int], EvalPoint] = {}
        self._eval_index = EvalIndex()
        self.steps_per_epoch: int | None = None
        #: Where :attr:`steps_per_epoch` came from: ``plan`` (a rank announced it), ``end`` (a
        #: rank's steps when it ended its first epoch: an evaluation in the middle of an epoch
        #: ends it too, so this one may be undone), ``next`` (an epoch whose next one began),
        #: ``loader`` (a rank's training DataLoader: its batches a pass, a guess until then).
        self._epoch_steps_from: str | None = None
        #: The steps a pass over a rank's training DataLoader makes (None: not said; 0: said
        #: and taken back, the script reporting its own steps).
        self._loader_steps: int | None = None
        #: A rank stepped on in an epoch it had ended: its evaluations end its epochs (the HF
        #: Trainer's ``eval_steps``), so an epoch's end says nothing of its length or progress.
        self.ends_mid_epoch = False
        #: The number of the run's first epoch: 1 (the built-in trainers), or 0 once a rank
        #: steps in an epoch 0 (``for epoch in range(epochs): sampler.set_epoch(epoch)``,
        #: most public scripts): the epochs before epoch ``e`` are ``e - epoch_base``.
        self.epoch_base = 1
        self.started_at: float | None = None
        self.first_step_at: float | None = None  # training time starts here (not start-up)
        #: Progress when the first step arrived: > 0 after --resume (epochs done before).
        self.progress_at_first_step: float | None = None
        self.last_event_at: float | None = None
        self.finished_at: float | None = None
        self.failure: RankFailureInfo | None = None
        self.stopped = False
        self.outcome: str | None = None  # None while live; "finished" | "failed" | "stopped"
        self.events_applied = 0
        #: Events for ranks outside ``range(world_size)``: ignored, never given a row.
        self.events_ignored = 0
        #: Lines of a replayed ``events.jsonl`` that were no event (malformed, too long, or
        #: the last one half-written by a crash): left out, and said so.
        self.lines_unread = 0
        #: Node -> that node's latest system sample, for nodes other than the dashboard's
        #: own: a ``NodeSample`` event from its ``ddptui join`` agent (or a monitor snapshot /
        #: its dict form), read by the system panel.
        self.node_samples: dict[int, object] = {}
        #: Rank -> bytes a second it read or wrote by ddptui's own recent sample of its
        #: process (ranks on this machine; set by the run's session every second): what a
        #: silent rank does while a call that keeps the GIL stops its beats.
        self.io_rates: dict[int, float] = {}
        #: Recent phase breakdowns per rank, for the straggler diagnosis.
        self.phase_history = PhaseHistory()
        #: Step -> the ranks' losses at it (the last SERIES_LENGTH steps, as the ranks' own
        #: series), kept as steps arrive: the mean line then costs the points drawn, not
        #: ranks x points (256 ranks x 2,000 points were a second of CPU per minute).
        self.loss_steps: dict[int, StepLoss] = {}
        self._loss_unordered: set[int] = set()  # ranks whose steps went back or repeated
        #: (attempt, step) -> the least time a rank took for it (the last SERIES_LENGTH), and the
        #: sum of those least times over every step: the run's time stepping where its ranks
        #: step together (DDP). Each rank's step ends at the same gradient all-reduce; the
        #: rank that began it last spent no time waiting for the others, so its time is the
        #: run's for that step. A rank that began a pass while rank 0 still wrote its
        #: checkpoint waited for it inside the step (torchvision's reference, 2 ranks: 1.0 s
        #: of comm in each later epoch's first step on rank 1; the run's rate read 38
        #: samples/s where rank 0's steps gave 51).
        self._least_step_time: dict[tuple[int, int], float] = {}
        self.lockstep_time = 0.0
        #: Per attempt, the step of the first rank's first timed step and the least time a
        #: rank took for it: the warm-up inside :attr:`lockstep_time`.
        self._first_steps: dict[int, tuple[tuple[int, int], float]] = {}
        #: A step came with DDP's phases (its comm timed): the ranks step together.
        self.lockstep = False
        #: A rank's steps went back or repeated (a script logging its own step numbers, an
        #: epoch's batch index say): steps of one number are not one step of the run.
        self.steps_unordered = False
        #: Every attempt so far (one unless ``--max-restarts`` restarted the run).
        self.attempts: list[AttemptRecord] = []
        #: Restarts allowed in all (for ``attempt 2/3``); 0 without ``--max-restarts``.
        self.max_restarts = 0
        #: Why a failed run was not restarted although restarts were left (one line).
        self.restart_refused: str | None = None
        #: Notes the ranks sent (``protocol.Note``), by code: the first of each.
        self.notes: dict[str, NoteSeen] = {}
        #: rank -> the digest of the first batch it trained on, where it has no
        #: DistributedSampler (``first_batch`` notes; a rank is a view: bounded by the world).
        self.first_batches: dict[int, int] = {}
        #: rank -> what its script's ``--local_rank`` option read where torchrun passed none:
        #: (the value, None for none; its LOCAL_RANK; the option spelled ``--local-rank``).
        #: Said beside a failure only (``local_rank_arg`` notes; bounded by the world).
        self.local_rank_reads: dict[int, tuple[int | None, int, bool]] = {}
        #: The ranks that took a training step with no process group (``alone`` notes; each
        #: taken back if it formed one after all): compared (``diagnosis.alone_diagnosis``).
        self.alone: set[int] = set()
        #: The launched processes that spawned workers of their own (``spawned`` notes):
        #: (node, rank) -> workers, as each first said it.
        self.spawners: dict[tuple[int | None, int], int] = {}
        #: The ranks a model's gradients are synchronized over, where fewer than the world
        #: (``data_parallel`` notes: tensor, pipeline or context parallel): the others train
        #: on the same batches, and the run's samples count each once (see batch_scale).
        self.data_parallel: int | None = None

    @property
    def batch_scale(self) -> float:
        """The share of the ranks' samples that are the run's own: the data-parallel ranks
        over the world (each batch is trained on by world / data_parallel ranks), 1 where the
        whole world is data-parallel. The run's samples, rates and throughput chart sum the
        ranks' times this; each rank's row keeps its own."""
        dp = self.data_parallel
        return dp / self.world_size if dp and dp < self.world_size else 1.0

    def grow(self, world_size: int) -> None:
        """The run has ``world_size`` ranks after all: the script spawned its own (one
        process per GPU), and they announced themselves with the world of their process
        group. New ranks start ``pending``."""
        for rank in range(self.world_size, world_size):
            self.ranks[rank] = RankView(rank, attempt=self.attempt)
        self.world_size = max(self.world_size, world_size)

    @property
    def attempt(self) -> int:
        """The current attempt number (0 first)."""
        return self.attempts[-1].attempt if self.attempts else 0

    def begin_attempt(self, record: AttemptRecord) -> None:
        """A new attempt starts: every rank is pending again; series and evals continue."""
        record.first_step = max((v.step for v in self.ranks.values()), default=0)
        self.attempts.append(record)
        if record.attempt > 0:
            for view in self.ranks.values():
                self._new_attempt(view, record.attempt)

    def end_attempt(self, outcome: str, failure: RankFailureInfo | None = None) -> None:
        if self.attempts and self.attempts[-1].outcome is None:
            self.attempts[-1].outcome = outcome
            self.attempts[-1].failure = failure

    @staticmethod
    def _new_attempt(view: RankView, attempt: int) -> None:
        if attempt <= view.attempt:
            return
        view.attempt = attempt
        view.last_seq = -1
        view.step_offset = view.step
        view.state = "pending"
        view.error = view.traceback = None
        view.epoch = None
        view.steps_in_epoch = 0
        view.ended_epoch = None
        view.samples_per_s = None
        view.recent_step_times.clear()
        view.forget_rates()
        # A new process: its evaluation batches count from 0, and it has not stepped yet.
        view.evaluations, view._evaluating_mark = 0, None
        view._beat_mark = view._step_mark()
        view._comm_key = None  # a new process group: its progress starts again

    # -- applying events ------------------------------------------------------------------
    def apply(self, event: protocol.AnyEvent, now: float | None = None) -> None:
        if type(event) is protocol.NodeSample:  # a node's system sample: no rank's event
            self.node_samples[event.node] = event
            return
        view = self.ranks.get(event.rank)
        if view is None:
            grown = protocol.grown_world(event, self.world_size)
            if grown is None:  # not a rank of this run: no row, no effect
                self.events_ignored += 1
                return
            self.grow(grown)
            view = self.ranks[event.rank]
        now = event.t if now is None else now
        if event.attempt != view.attempt:
            if event.attempt < view.attempt:  # late news from an attempt already over
                self.events_ignored += 1
                return
            self._new_attempt(view, event.attempt)
        if self.started_at is None:
            self.started_at = now
        self.last_event_at = now
        self.events_applied += 1
        if event.seq > view.last_seq + 1 and view.last_seq >= -1:
            gap = event.seq - view.last_seq - 1
            if gap > MAX_SEQ_GAP:  # a forged or corrupt seq, not drops: one gap, named
                view.gaps += 1
                view.seq_jump = view.seq_jump or (view.last_seq, event.seq)
            else:
                view.gaps += gap
        view.last_seq = max(view.last_seq, event.seq)
        view.last_seen = now
        view.events += 1
        handler = _HANDLERS.get(type(event), _UNSEEN)
        if handler is _UNSEEN:  # a subclass of an event type (tests' fixtures, say)
            handler = _handler_for(type(event))
        if handler is not None:
            handler(self, view, event, now)
        if self.first_step_at is not None and self.progress_at_first_step is None:
            self.progress_at_first_step = self.progress() or 0.0

    def _on_status(self, view: RankView, ev: protocol.Status, now: float) -> None:
        if ev.state == "started" and ev.pid is not None and ev.pid != view.pid:
            view.spawned = 0  # another process under this rank: a spawned worker, say
        view.state = ev.state
        for name in (
            "pid",
            "host",
            "local_rank",
            "device",
            "device_uuid",
            "error",
            "traceback",
        ):
            value = getattr(ev, name)
            if value is not None:
                setattr(view, name, value)
        # ``node`` is newer than the Status event of older runs: read it only when present,
        # and only when it is a plausible node rank.
        node = getattr(ev, "node", None)
        if isinstance(node, int) and not isinstance(node, bool) and 0 <= node < 1_000_000:
            view.node = node
        if ev.dropped is not None:
            view.reporter_dropped = ev.dropped
        if ev.epochs and (not self.epochs or self.epochs_flag):
            self.epochs, self.epochs_flag = ev.epochs, None
        if ev.steps_per_epoch and self._epoch_steps_from != "plan":
            self.steps_per_epoch, self._epoch_steps_from = ev.steps_per_epoch, "plan"

    def _on_step(self, view: RankView, ev: protocol.Step, now: float) -> None:
        if self.first_step_at is None:
            self.first_step_at = now
        stepped = view.last_step_at is not None
        view.last_step_at = now
        if view.state == "pending":
            view.state = "started"
        if ev.epoch is not None and ev.epoch != view.epoch:
            if view.epoch is not None and view.steps_in_epoch:
                self._epoch_went_on(view.steps_in_epoch)
            view.epoch = ev.epoch
            view.steps_in_epoch = 0
            if ev.epoch == 0:
                self.epoch_base = 0
            if self.epochs_flag and self.epochs and ev.epoch - self.epoch_base >= self.epochs:
                self.epochs = self.epochs_flag = None  # the script's flag meant something else
        elif ev.epoch is not None and ev.epoch == view.ended_epoch:
            self._epoch_reopened(view)
        count = ev.steps  # more than 1: a fast script's steps in one event (its last's number)
        view.steps_in_epoch += count
        if stepped and view.step_offset + ev.step <= view.step:
            self.steps_unordered = True  # a step again: its least time is no step's own
        view.step = view.step_offset + ev.step
        view.samples_total += ev.samples
        if ev.loss is not None:
            view.loss = ev.loss
            self._count_loss(view, ev.loss)
            view.loss_series.append((view.step, ev.loss))
        if ev.samples_per_s is not None:
            view.samples_per_s = ev.samples_per_s
            series = view.sps_series
            if series and now - series[-1][0] > RATE_GRACE_S:  # a pause, maybe (cheap first)
                start = series[-1][0] + view.rate_grace()
                if now > start:
                    view.pauses.append((start, now, ev.samples_per_s))
            series.append((now, ev.samples_per_s))
            if ev.step_time:  # a rate with its time: the recent rate weighs it by that
                view.note_rate(now, ev.samples_per_s, ev.step_time, count)
        if ev.step_time is not None:
            each = ev.step_time if count == 1 else ev.step_time / count
            view.step_time = each
            if count == 1:
                view.recent_step_times.append(each)
            else:
                # Each of its steps: the window is of steps, not of events. One entry for an
                # event of 18 steps left a short run's two slow first steps (DDP's first
                # iterations, 7-9 ms) the window's median: a tiny model's rank 1 read
                # "straggler: step time 7 ms is 1.7x the median 4 ms" where both ranks
                # stepped in 1.3-1.5 ms, in lock step.
                view.recent_step_times.extend(repeat(each, min(count, _RECENT)))
            view.time_stepping += ev.step_time
            view.samples_timed += ev.samples
            view.steps_timed += count
            # One step of the run is one step number of one attempt on every rank (after a
            # restart the ranks' earlier steps may differ: the one killed first did fewer).
            key = (view.attempt, ev.step)
            if view.first_step_attempt != view.attempt:
                view.first_step_attempt = view.attempt
                view.first_steps_time += ev.step_time
                view.first_steps_samples += ev.samples
                first = self._first_steps.setdefault(view.attempt, (key, ev.step_time))
                if first[0] == key and ev.step_time < first[1]:
                    self._first_steps[view.attempt] = (key, ev.step_time)
            if count == 1:
                self._lockstep(key, ev.step_time)
            else:  # each of its steps, at their mean time (ranks group their steps apart)
                for number in range(max(0, ev.step - count + 1), ev.step + 1):
                    self._lockstep((view.attempt, number), each)
        phases = getattr(ev, "phases", None)
        if phases:
            if not self.lockstep and "comm" in phases:
                self.lockstep = True
            view.phases = phases
            self.phase_history.add(view.rank, phases, count)
        view.still_from(now)  # progress

    def _lockstep(self, key: tuple[int, int], seconds: float) -> None:
        """One rank's time for the step ``key`` (attempt, step): the least over the ranks is
        the run's time for it (:attr:`lockstep_time`)."""
        least = self._least_step_time.get(key)
        if least is None:
            self._least_step_time[key] = seconds
            self.lockstep_time += seconds
            if len(self._least_step_time) > SERIES_LENGTH:  # the oldest step first in
                del self._least_step_time[next(iter(self._least_step_time))]
        elif seconds < least:
            self._least_step_time[key] = seconds
            self.lockstep_time -= least - seconds

    def _count_loss(self, view: RankView, loss: float) -> None:
        """Count a rank's loss at its step into :attr:`loss_steps` (call before appending it to
        the rank's series). A step the rank reported before (a script logging one step twice,
        or steps that go back) replaces its value there, as one value per rank and step."""
        step, series = view.step, view.loss_series
        if series and step <= series[-1][0]:
            self._loss_unordered.add(view.rank)  # its series may hold any step from now on
        at = self.loss_steps.get(step)
        if at is None:
            at = self.loss_steps[step] = StepLoss()
            if len(self.loss_steps) > SERIES_LENGTH:  # the oldest step first in (in O(1))
                del self.loss_steps[next(iter(self.loss_steps))]
        elif view.rank in self._loss_unordered:
            for seen, value in reversed(series):
                if seen == step:
                    at.add(value, -1)
                    break
        at.add(loss)

    def _on_beat(self, view: RankView, ev: protocol.Beat, now: float) -> None:
        if view.state == "pending":
            view.state = "started"  # a beat says the rank is alive, whatever came before
        marks = tuple((m.pg, m.op, m.started, m.completed, m.backend) for m in ev.collectives)
        moved = (
            view.still_since is None
            or ev.digest is None
            or ev.digest != view._digest
            # progress is the sequence numbers; an op or group name filled in later is not
            or [m[2:4] for m in marks] != [m[2:4] for m in view.collectives]
        )
        # Each group's last collective started (None: none yet, by its recorder).
        started = tuple((m[0], m[4], m[2]) for m in marks)
        if started:
            if started != view._comm_key:
                view._comm_key, view._comm_steps = started, ev.steps
            elif ev.steps - view._comm_steps > view.steps_without_comm:
                view.steps_without_comm = ev.steps - view._comm_steps
        view.note_evaluations(ev.evaluations)
        view.frame, view.waiting, view.beat_at = ev.frame, ev.waiting, now
        view.no_ddp = ev.ddp is False
        view._digest, view.collectives = ev.digest, marks
        view.cpu, view.io, view.wakes = ev.cpu, ev.io, ev.wakes
        if (
            moved
            or view.cpu_since is None
            or (ev.cpu is not None and ev.cpu < view.cpu_since)
            or (ev.io is not None and (view.io_since is None or ev.io < view.io_since))
            # another thread sampled (a count that went back), or the first count
            or (ev.wakes is not None and (view.wakes_since is None or ev.wakes < view.wakes_since))
        ):
            view.still_from(now)

    def _on_eval(self, view: RankView, ev: protocol.Eval, now: float) -> None:
        # Every rank reports the same all-reduced result; the first one to arrive counts,
        # until one that replaces it (see eval_replaces: a later attempt's, a lower rank's). A
        # script may evaluate more than once an epoch (every N steps: the HF Trainer's
        # ``eval_steps``): the n-th evaluation of a rank in an epoch is the n-th of every
        # rank, and a new point. Keyed by the epoch alone, all but an epoch's first were lost,
        # and the run's "final accuracy" was its last epoch's first evaluation.
        key = self._eval_index.key(ev)
        old = self.evals.get(key)
        if old is None or eval_replaces(old.attempt, old.rank, ev.attempt, ev.rank):
            self.evals[key] = EvalPoint(
                ev.epoch, ev.accuracy, ev.loss, ev.count, now, ev.attempt, key[1], ev.rank
            )
            if len(self.evals) > MAX_EVALS:
                del self.evals[min(self.evals, key=_eval_order)]

    def _on_epochend(self, view: RankView, ev: protocol.EpochEnd, now: float) -> None:
        if view.ended_epoch is None or ev.epoch > view.ended_epoch:
            view.ended_epoch = ev.epoch
        if (
            self._epoch_steps_from in (None, "loader")
            and view.steps_in_epoch
            and not self.ends_mid_epoch
        ):
            self.steps_per_epoch, self._epoch_steps_from = view.steps_in_epoch, "end"

    def _epoch_went_on(self, steps: int) -> None:
        """A rank stepped into its next epoch after ``steps`` steps of the last: that is an
        epoch's length (the longest so far: a run resumed in the middle of one begins with
        fewer), unless a rank announced it."""
        if self._epoch_steps_from == "plan":
            return
        if self._epoch_steps_from != "next" or steps > (self.steps_per_epoch or 0):
            self.steps_per_epoch, self._epoch_steps_from = steps, "next"

    def _epoch_reopened(self, view: RankView) -> None:
        """``view`` steps on in an epoch it ended (an evaluation in its middle ended it): the
        epoch was not as short as it then was, and the ends of epochs say nothing from now
        on (see :attr:`ends_mid_epoch`)."""
        self.ends_mid_epoch = True
        if self._epoch_steps_from == "end":
            self.steps_per_epoch = self._loader_steps or None
            self._epoch_steps_from = "loader" if self._loader_steps else None

    def _on_note(self, view: RankView, ev: protocol.Note, now: float) -> None:
        if ev.code == "spawned":  # the process's own state, not a finding
            if ev.workers:
                view.spawned = ev.workers
                view.frame = view.waiting = None  # where it stood before it spawned
                if len(self.spawners) < MAX_SPAWNERS:
                    self.spawners.setdefault((view.node, view.rank), ev.workers)
            return
        if ev.code == "workers_formed":  # the starting process's word, not a finding: it
            # comes after its workers took its rank over, so the rank's view is theirs
            if ev.workers and len(self.spawners) < MAX_SPAWNERS:
                self.spawners.setdefault((view.node, view.rank), ev.workers)
            return
        if ev.code == "loader_steps":  # the run's plan as a loader says it, not a finding
            if ev.steps is None:  # the rank's steps are the script's own (ddptui.log) now
                self._loader_steps = 0
                if self._epoch_steps_from == "loader":
                    self.steps_per_epoch = self._epoch_steps_from = None
            elif self._loader_steps is None:
                self._loader_steps = ev.steps
                if self._epoch_steps_from is None:
                    self.steps_per_epoch, self._epoch_steps_from = ev.steps, "loader"
            return
        if ev.code == "data_parallel":  # the run's shape, not a finding (the least said)
            if ev.group_size and (self.data_parallel is None or ev.group_size < self.data_parallel):
                self.data_parallel = ev.group_size
            return
        if ev.code == "first_batch":  # every rank's, compared (diagnosis.same_batches)
            if ev.digest is not None:
                self.first_batches[view.rank] = ev.digest
            return
        if ev.code == "alone":  # every rank's, compared (diagnosis.alone)
            if ev.group_size is None:
                self.alone.add(view.rank)
            else:
                self.alone.discard(view.rank)
            return
        if ev.code == "local_rank_arg":  # a failure's hint (session), no finding by itself
            if ev.local_rank is not None and ev.read == ev.local_rank:  # the script set it
                self.local_rank_reads.pop(view.rank, None)
            elif ev.local_rank is not None:
                self.local_rank_reads[view.rank] = (ev.read, ev.local_rank, bool(ev.dashed))
            return
        if ev.code not in self.notes:  # codes are a closed set (the schema): the dict stays tiny
            self.notes[ev.code] = NoteSeen(
                ev.code,
                view.rank,
                ev.epoch,
                ev.passes,
                now,
                group=(ev.group_rank, ev.group_size),
                slurm=bool(ev.slurm),
                workers=ev.workers,
                seconds=ev.seconds,
            )

    def set_outcome(
        self, outcome: str, failure: RankFailureInfo | None = None, now: float | None = None
    ) -> None:
        """Record how the run ended (from the launcher): finished, failed or stopped."""
        self.outcome = outcome
        self.failure = failure
        self.finished_at = now if now is not None else self.last_event_at
        if failure is not None and not failure.spawner and failure.rank in self.ranks:
            view = self.ranks[failure.rank]
            # The launcher knows how the rank ended; the rank itself may have said why.
            self.failure = failure = dataclasses.replace(
                failure,
                error=failure.error or view.error,
                traceback=failure.traceback or view.traceback,
            )
            view.state = "failed"
            view.error = view.error or failure.describe()
        if outcome in ("failed", "stopped", "hung"):
            # The launcher ended the run: a rank that never said it ended was torn down.
            for view in self.ranks.values():
                if view.state in ("started", "pending"):
                    view.state = "stopped"

    # -- reading ----------------------------------------------------------------------------
    @property
    def eval_history(self) -> list[EvalPoint]:
        return [self.evals[key] for key in sorted(self.evals, key=_eval_order)]

    @property
    def last_eval(self) -> EvalPoint | None:
        history = self.eval_history
        return history[-1] if history else None

    @property
    def status(self) -> str:
        if self.outcome:
            return self.outcome
        if any(v.state == "failed" for v in self.ranks.values()):
            return "failing"
        if any(v.state != "pending" for v in self.ranks.values()):
            return "running"
        return "starting"

    def live_samples_per_s(self, now: float) -> float | None:
        """:meth:`global_samples_per_s` at ``now``, or None while no live rank has a rate (a
        rank's first step gives none: "0 samples/s" while each step of barlowtwins' took 9 s).
        Once every rank has said it finished, before the launcher says the run ended: the
        run's rate over its steps (:meth:`final_samples_per_s`), which the summary line then
        prints; swav's last console line read ``-- samples/s`` there, in every run."""
        rates = [
            rate
            for v in self.ranks.values()
            if v.state == "started" and (rate := v.rate_at(now)) is not None
        ]
        if rates:
            return sum(rates) * self.batch_scale
        views = self.ranks.values()
        if views and self.samples_counted and all(v.state == "finished" for v in views):
            return self.final_samples_per_s() or None
        return None

    def global_samples_per_s(self, now: float | None = None) -> float:
        """Sum of each live rank's throughput at ``now`` (see :meth:`RankView.rate_at`; None:
        their latest rates)."""
        return self.batch_scale * sum(
            v.rate_at(now) or 0.0
            for v in self.ranks.values()
            if v.state == "started" and v.samples_per_s
        )

    def final_samples_per_s(self) -> float:
        """The run's throughput over its steps so far, whatever the ranks' states: for a run
        that ended (the last step's rate says little then: nanoGPT's last step holds a 20 s
        evaluation), and for an evaluation's console line. Every rank's timed samples over
        the longest time a rank spent stepping: ranks that step together (DDP) share that
        time, and it is the sum of their means over their steps
        (:meth:`RankView.rate_over_run`); a rank that ran out of batches
        early (uneven inputs under DDP's ``Join``) or ended early trained its samples in the
        run's time, not in its own: its mean added to the others' made a run of 4,160
        samples in 26 s of steps read 318 samples/s instead of 159. Where the ranks step
        together (DDP), the run's time is each step's least time over the ranks
        (:attr:`lockstep_time`): a rank's wait inside a step for another that was not
        stepping yet (writing rank 0's checkpoint) is no time the run spent stepping. A rank
        whose steps said no time adds its latest rate."""
        return self._mean_rate(after_first=False)[0]

    def rate_after_first_step(self) -> tuple[float, float] | None:
        """The run's throughput over its steps as :meth:`final_samples_per_s` has it, but
        for each attempt's first step, and that first step's seconds (the run's where its
        ranks step together, else the longest a rank took): the warm-up apart, for a run
        whose first step holds it (nanoGPT under torch.compile on an H200: 981 samples/s
        over the run, 15.5 s of it its first step). None where no rank timed a step after
        its first."""
        rate, first = self._mean_rate(after_first=True)
        return None if rate <= 0.0 or first is None else (rate, first)

    def _mean_rate(self, after_first: bool) -> tuple[float, float | None]:
        """(samples/s, the first steps' seconds) of :meth:`final_samples_per_s`, each
        attempt's first step left out where ``after_first`` (its seconds then None where no
        rank timed more than its first step)."""
        samples, longest, untimed, first = 0, 0.0, 0.0, 0.0
        for view in self.ranks.values():
            if view.samples_timed and view.time_stepping > 0.0:
                timed, spent = view.samples_timed, view.time_stepping
                if after_first:
                    timed, spent = view.after_first_steps()
                    first = max(first, view.first_steps_time)
                    if timed <= 0 or spent <= 0.0:
                        continue
                samples += timed
                longest = max(longest, spent)
            else:
                untimed += view.samples_per_s or 0.0
        if after_first and not samples:
            return 0.0, None
        if after_first and self._run_stepping_time() is not None:
            first = self._warm_up_time()
        longest = self._stepping_time(longest, after_first)
        rate = (samples / longest if longest else 0.0) + untimed
        return rate * self.batch_scale, first

    def _run_stepping_time(self) -> float | None:
        """:attr:`lockstep_time` where it is the run's time stepping (DDP, steps numbered
        once each); else None."""
        if self.lockstep and not self.steps_unordered and self.lockstep_time > 0.0:
            return self.lockstep_time
        return None

    def _stepping_time(self, spent: float, after_first: bool) -> float:
        """``spent``, seconds that a rank (or the slowest rank) spent inside its steps; under
        DDP the run's own stepping time (without each attempt's first step where
        ``after_first``) where that is shorter: the waits inside a rank's steps for ranks that
        were not stepping left out."""
        stepped = self._run_stepping_time()
        if stepped is not None and after_first:
            stepped -= self._warm_up_time()
        return stepped if stepped is not None and 0.0 < stepped < spent else spent

    def rank_rate_over_run(self, view: RankView) -> float | None:
        """A rank's mean samples/s over its steps (:meth:`RankView.rate_over_run`); under DDP
        without its waits inside them for ranks that were not stepping (its time stepping, or
        the run's where that is shorter): rank 1 of torchvision's reference, which waited for
        rank 0's checkpoints, read 15 samples/s beside rank 0's 21 and the run's 43, as if it
        were the slow one."""
        if view.samples_timed and view.time_stepping > 0.0:
            return view.samples_timed / self._stepping_time(view.time_stepping, after_first=False)
        return view.rate_over_run()

    def rank_step_time_over_run(self, view: RankView) -> float | None:
        """A rank's mean step time over the run, as :meth:`rank_rate_over_run` reads its time
        (without the waits inside its steps for ranks that were not stepping): once a run has
        ended, its table's step time beside its mean rate. The latest steps' mean it showed
        there was whatever the run's last seconds held: nanoGPT's rank 1 read 5.21 s, its
        last step's wait for rank 0's final evaluation, beside rank 0's 12.4 ms. None where
        no step said its time."""
        if view.steps_timed <= 0 or view.time_stepping <= 0.0:
            return None
        return self._stepping_time(view.time_stepping, after_first=False) / view.steps_timed

    def rank_rate_after_first_step(self, view: RankView) -> float | None:
        """:meth:`rank_rate_over_run` without each attempt's first step (its warm-up), as
        :meth:`rate_after_first_step` has the run's (a first step as long as ten others puts
        a 100-step rank's mean 8 % under its pace, one that compiles for 15 s a third under).
        None where the rank timed no step after its first."""
        samples, spent = view.after_first_steps()
        if samples <= 0 or spent <= 0.0:
            return None
        return samples / self._stepping_time(spent, after_first=True)

    def _warm_up_time(self) -> float:
        """The run's seconds in each attempt's first step (the least over its ranks)."""
        return sum(least for _, least in self._first_steps.values())

    def samples_per_s_over_run(self) -> float | None:
        """:meth:`final_samples_per_s` where it means something: None when no sample was
        counted or no rank's rate is known (the end line and ``summary.json``)."""
        if not self.samples_counted or not any(
            self.rank_rate_over_run(v) for v in self.ranks.values()
        ):
            return None
        return self.final_samples_per_s()

    @property
    def samples_total(self) -> int:
        """The run's samples: the ranks' (each batch once where ranks share batches, see
        :attr:`batch_scale`)."""
        total = sum(v.samples_total for v in self.ranks.values())
        scale = self.batch_scale
        return total if scale == 1.0 else round(total * scale)

    @property
    def samples_counted(self) -> bool:
        """Some rank has counted samples: its rates mean something (0 samples/s would
        otherwise say a script that reports no samples trains nothing)."""
        return any(v.samples_total for v in self.ranks.values())

    @property
    def mean_loss(self) -> float | None:
        """The mean of the ranks' latest losses, of the ranks still stepping with the others:
        a rank whose last step came more than its rate's grace (three of its step times, at
        least 2 s) before the last step of any rank stopped while the run went on (out of
        batches under DDP's ``Join``, or ended); its row keeps its loss, but the header's is
        the run's now (a Join run ended reading 0.1227, its last step's loss 0.0001 and its
        idle rank's, 390 steps before, 0.2454). Ranks that pause together (an evaluation, a
        checkpoint) all count."""
        # A loss comes only with a step (_on_step), which sets last_step_at first.
        stepped = [v for v in self.ranks.values() if v.loss is not None]
        if not stepped:
            return None
        latest = max(v.last_step_at for v in stepped)
        current = [v.loss for v in stepped if latest - v.last_step_at <= v.rate_grace()]
        return sum(current) / len(current)  # the latest rank's own loss at least

    @property
    def current_epoch(self) -> int | None:
        epochs = [v.epoch for v in self.ranks.values() if v.epoch is not None]
        return min(epochs) if epochs else None

    def progress(self) -> float | None:
        """Fraction of the run done, 0..1, once the epoch count is known."""
        if not self.epochs:
            return None
        if self.outcome == "finished":
            return 1.0
        views = [v for v in self.ranks.values() if v.epoch is not None]
        if not views:
            return 0.0
        slowest = min(views, key=lambda v: (v.epoch, v.steps_in_epoch))
        done = slowest.epoch - self.epoch_base  # the epochs before the one it is in
        ended = slowest.ended_epoch
        if ended is not None and ended >= slowest.epoch and not self.ends_mid_epoch:
            done += 1
        elif self.steps_per_epoch:
            done += min(slowest.steps_in_epoch / self.steps_per_epoch, 1.0)
        return max(0.0, min(done / self.epochs, 1.0))

    def elapsed(self, now: float) -> float:
        if self.started_at is None:
            return 0.0
        end = self.finished_at if self.outcome and self.finished_at else now
        return max(0.0, end - self.started_at)

    def eta(self, now: float) -> float | None:
        """Seconds left, extrapolated from training time so far (start-up excluded: it does
        not repeat) and the progress made in that time (after ``--resume`` the epochs done
        before do not count); None until it can be estimated."""
        if self.outcome:
            return 0.0 if self.outcome == "finished" else None
        progress = self.progress()
        if progress is None or self.first_step_at is None:
            return None
        made = progress - (self.progress_at_first_step or 0.0)
        if made <= 0:
            return None
        training = max(0.0, now - self.first_step_at)
        return training * (1 - progress) / made

    @property
    def dropped(self) -> int:
        return sum(max(v.gaps, v.reporter_dropped) for v in self.ranks.values())

    @property
    def seq_jumps(self) -> list[tuple[int, int, int]]:
        """``(rank, from seq, to seq)`` of every rank whose seq jumped implausibly far."""
        return [(r, *v.seq_jump) for r, v in sorted(self.ranks.items()) if v.seq_jump]

    def health(self, now: float) -> dict[int, str]:
        """Ranks that need attention, with why: stragglers and silent ranks."""
        problems: dict[int, str] = {}
        if self.outcome:
            return problems
        # Each live rank's typical step time, read once (the median of its window).
        live = {r: (v, v.typical_step_time) for r, v in self.ranks.items() if v.state == "started"}
        typical = {
            r: value
            for r, (view, value) in live.items()
            if value and len(view.recent_step_times) >= STRAGGLER_MIN_STEPS
        }
        if len(typical) >= 2:
            median = statistics.median(typical.values())
            for rank, value in typical.items():
                if median > 0 and value > STRAGGLER_FACTOR * median:
                    problems[rank] = (
                        f"straggler: step time {value * 1000:.0f} ms is "
                        f"{value / median:.1f}x the median {median * 1000:.0f} ms"
                    )
        for rank, (view, interval) in live.items():
            if view.last_seen is None or view.spawned:
                continue  # a spawner waits for its workers in silence, by design
            if interval is None and view.step == 0:
                limit = STARTUP_SILENT_S
            else:
                limit = max(MIN_SILENT_S, SILENT_INTERVALS * (interval or 0.0))
            quiet = now - view.last_seen
            if quiet > limit:
                problems[rank] = f"silent: no event for {quiet:.0f} s"
                moved = self.io_rates.get(rank)
                if moved is not None and moved >= IDLE_IO_BYTES_PER_S:  # work, to the hang rule
                    problems[rank] += f", its I/O moving {moved / 2**20:.1f} MiB/s"
        return problems


_UNSEEN = object()
#: Event type -> the RunState method that applies it (looked up once per event: the hot path).
_HANDLERS: dict[type, Any] = {
    protocol.Status: RunState._on_status,
    protocol.Step: RunState._on_step,
    protocol.Beat: RunState._on_beat,
    protocol.Eval: RunState._on_eval,
    protocol.EpochEnd: RunState._on_epochend,
    protocol.Note: RunState._on_note,
}


def _handler_for(kind: type) -> Any:
    """The handler of ``kind``'s nearest event type (None: none), remembered for next time."""
    handler = next((_HANDLERS[k] for k in kind.__mro__ if k in _HANDLERS), None)
    _HANDLERS[kind] = handler
    return handler
