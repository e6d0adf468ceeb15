"""Plain, immutable views of a RunState for drawing: taken under the state's lock, drawn
after it is released. Pure functions, testable without Textual.

:func:`run_frame` is cheap (per-rank latest values) and runs at the screen's refresh rate;
:func:`chart_data` walks the series and runs at the slower chart rate.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from ddptui.formatting import (
    amp_label,
    counted,
    epoch_ordinal,
    fmt_duration,
    fmt_epoch,
    fmt_eta,
    fmt_eval,
    fmt_first_step,
    fmt_num,
    fmt_per_s,
    fmt_rate,
    fmt_samples,
    fmt_step_time,
    ranks_text,
)
from ddptui.rank.frames import traceback_files
from ddptui.run.state import RankFailureInfo, RankView, RunState

#: Most points drawn per chart line (more would not fit a terminal's width anyway).
MAX_POINTS = 240
#: Narrowest time bucket of the global throughput chart, in seconds.
MIN_BUCKET_S = 0.25
#: Most (time, samples/s) points summed for the global throughput chart, over all ranks.
THROUGHPUT_POINTS = 16_000


@dataclass(slots=True)
class RankRow:
    """One line of the rank table, already formatted. Not frozen: a frozen dataclass sets
    each of its 17 fields through ``object.__setattr__``, and a frame at 256 ranks makes 256
    rows (run_frame 2.7-3.1 ms frozen, 1.9-2.0 ms not); nothing changes a row once made."""

    rank: int
    pid: str
    host: str
    device: str
    epoch_step: str
    loss: str
    samples_per_s: str
    step_time: str
    last_seen: str
    state: str
    #: Why the rank needs attention (straggler, silent, failed), or None.
    problem: str | None
    #: Node rank (multi-node runs), None when the rank did not say.
    node: int | None = None
    #: Where the rank is when that says something: its frame while it prepares (before its
    #: first step) or while it stands still, and the collective it waits in.
    where: str = ""
    #: Its last collective started and whether it completed, per process group (the Flight
    #: Recorder's progress in its heartbeat): ``all_reduce #812 …`` (waiting) or ``#812 ✓``.
    collective: str = ""
    #: Raw numbers behind the formatted cells, for node summaries and ordering: the rank's
    #: typical (median) step time orders the rows; the one shown, its last 2 s's mean, is
    #: what its node's summary row averages.
    step_time_s: float | None = None
    shown_step_s: float | None = None
    samples_per_s_value: float | None = None
    loss_value: float | None = None

    @property
    def group(self) -> int | str | None:
        """Which node the rank runs on: its node rank, else its host, else None (unknown)."""
        return self.node if self.node is not None else (self.host if self.host != "--" else None)

    def cells(self) -> tuple[str, ...]:
        return (
            str(self.rank),
            self.pid,
            self.host,
            self.device,
            self.epoch_step,
            self.loss,
            self.samples_per_s,
            self.step_time,
            self.last_seen,
            self.state,
            self.collective,
            self.where,
        )


@dataclass(frozen=True)
class RunFrame:
    """Everything the header, rank table and failure panel show, at one instant."""

    status: str
    elapsed: str
    eta: str
    progress: float | None
    epoch: str
    summary: str
    rows: tuple[RankRow, ...]
    problems: dict[int, str]
    failure: RankFailureInfo | None
    #: Rank -> (pid, device_uuid), for joining ranks to GPUs and tracking their processes.
    rank_devices: dict[int, tuple[int | None, str | None]]
    events_applied: int
    #: One summary per node, in node order; empty for a single-node run.
    nodes: tuple[NodeSummary, ...] = ()
    #: ``attempt 2/3 (restarted after: rank 1 was killed by signal SIGKILL)`` once a run
    #: with ``--max-restarts`` has restarted; empty otherwise.
    attempt: str = ""


#: Most distinct rank devices named in the header before the rest are counted.
MAX_DEVICES_SHOWN = 4


def device_label(config: dict[str, Any], rank_devices: Iterable[str | None]) -> str | None:
    """The ranks' devices as they reported them (``cpu``, ``cuda:0``, ``cuda:0-7``), else the
    run's device option (``cpu``, ``cuda``, ``device auto``), else None (unknown)."""
    known = sorted({str(d) for d in rank_devices if d and d != "--"}, key=_device_order)
    if known:
        return _summarise_devices(known)
    option = config.get("device")  # RunConfig.device: auto | cpu | cuda (absent in old runs)
    if option in ("cpu", "cuda"):
        return str(option)
    if option:
        return f"device {option}"
    return None


def _device_order(device: str) -> tuple[str, int]:
    kind, _, index = device.partition(":")
    return (kind, int(index)) if index.isdigit() else (device, -1)


def _summarise_devices(devices: list[str]) -> str:
    cuda = [int(d[5:]) for d in devices if d.startswith("cuda:") and d[5:].isdigit()]
    if len(cuda) == len(devices) and len(cuda) > 2 and cuda == list(range(cuda[0], cuda[-1] + 1)):
        return f"cuda:{cuda[0]}-{cuda[-1]}"
    if len(cuda) == len(devices):
        shown = ",".join(map(str, cuda[:MAX_DEVICES_SHOWN]))
        more = len(cuda) - MAX_DEVICES_SHOWN
        return f"cuda:{shown}" + (f" +{more}" if more > 0 else "")
    shown = ",".join(devices[:MAX_DEVICES_SHOWN])
    more = len(devices) - MAX_DEVICES_SHOWN
    return shown + (f" +{more}" if more > 0 else "")


def setup_label(
    config: dict[str, Any], rank_devices: Iterable[str | None] = (), ranks: int = 0
) -> str:
    """``spawn · gloo · amp bf16 · cuda:0,1 · 2 ranks``: the header's account of the run, as
    far as ddptui knows it (see :func:`amp_label` and :func:`device_label`). ``ranks``: the
    ranks the run has now, where the script's own workers grew it past the processes ddptui
    started (one process whose two workers are the ranks read "1 ranks")."""
    parts = [str(config.get("launcher")), str(config.get("backend")), amp_label(config)]
    device = device_label(config, rank_devices)
    if device:
        parts.append(device)
    world = config.get("world_size")
    started = world if isinstance(world, int) and not isinstance(world, bool) else 0
    parts.append(counted(max(started, ranks), "rank") if started or ranks else f"{world} ranks")
    return " · ".join(parts)


def run_frame(state: RunState, now: float) -> RunFrame:
    """Snapshot the per-rank table and the header numbers (call with the state's lock held)."""
    problems = state.health(now)
    if not state.outcome:  # a rank behind in the collectives the others wait in
        problems = {**behind_ranks(state), **problems}
    # Once the run has ended, ages are measured at its end, not against a running clock.
    seen_at = state.finished_at if state.outcome and state.finished_at else now
    rows = []
    devices = {}
    for rank, view in sorted(state.ranks.items()):
        problem = problems.get(rank)
        if view.state == "failed":
            problem = view.error or "failed"
        # The epoch as the header counts it (torchvision's reference, epochs from 0: the
        # header read "epoch 2/6" beside rows at "1/6", epoch 1's sixth step).
        epoch = "-" if view.epoch is None else epoch_ordinal(state, view.epoch)
        step = f"{epoch}/{view.steps_in_epoch}"
        shown_state = view.activity
        # Live: what the rank keeps up at present (a pause decays it); ended: its mean rate.
        rate = state.rank_rate_over_run(view) if state.outcome else view.rate_at(now)
        # Live: its latest steps' mean time; ended: its mean over the run, as its rate.
        recent_step = (
            state.rank_step_time_over_run(view) if state.outcome else view.recent_step_time()
        )
        rows.append(
            RankRow(
                node=view.node,
                step_time_s=view.typical_step_time or view.step_time,
                shown_step_s=recent_step,
                samples_per_s_value=rate if view.state == "started" else None,
                loss_value=view.loss,
                rank=rank,
                pid=str(view.pid) if view.pid is not None else "--",
                host=view.host or "--",
                device=view.device or "--",
                epoch_step=step,
                loss=fmt_num(view.loss),
                samples_per_s=fmt_per_s(rate),
                step_time=fmt_step_time(recent_step),
                last_seen=_ago(seen_at, view.last_seen),
                state=shown_state,
                problem=problem,
                where=where_cell(view, state.outcome is not None),
                collective=collective_cell(
                    view.collectives, failed_in_collective(view), view.state == "finished"
                ),
            )
        )
        devices[rank] = (view.pid, view.device_uuid)
    last = state.last_eval
    # Live: the ranks' current rates. Ended: their means over the run (no rank runs, so
    # "0 samples/s" would say nothing about the run, and the last step's rate little).
    counted = state.samples_counted
    mean = state.final_samples_per_s() if state.outcome is not None else 0.0
    rate = (
        fmt_rate(state.live_samples_per_s(now), counted)
        if state.outcome is None
        else f"{fmt_rate(mean, counted)} over the run"
        + (fmt_first_step(mean, state.rate_after_first_step()) if counted else "")
    )
    parts = [
        rate,
        f"loss {fmt_num(state.mean_loss)}",
        fmt_eval(last),
        fmt_samples(state),
    ]
    if state.dropped:
        parts.append(f"{state.dropped} events dropped")
    return RunFrame(
        status=state.status,
        elapsed=fmt_duration(state.elapsed(now)),
        eta=fmt_eta(state, now),
        progress=state.progress(),
        epoch=fmt_epoch(state, state.current_epoch),
        summary="  ".join(parts),
        rows=tuple(rows),
        problems=problems,
        failure=state.failure,
        rank_devices=devices,
        events_applied=state.events_applied,
        nodes=node_summaries(rows),
        attempt=attempt_label(state),
    )


#: Ranks waiting in a collective for at least this long (about one heartbeat) make a rank that
#: has not started it "behind".
BEHIND_AFTER_S = 2.0


def collective_cell(marks: Sequence[tuple], failed: bool = False, finished: bool = False) -> str:
    """``all_reduce #812 …`` (started, not completed) or ``#811 ✓`` (completed), per process
    group (named when there are several, with its backend when a group has two); marks are
    ``(group, op, started, completed, backend)``. ``failed``: the rank failed inside its last
    collective (:func:`failed_in_collective`): with one group's, that one is ``#812 ✗``
    (gloo counts a collective that raised on a lost peer as completed). ``finished``: the
    rank ended well, so every collective it started had returned: ``#80 ✓`` where its last
    beat's marks still said started (gloo marks a collective completed after it returns:
    moco's finished ranks read ``broadcast #80 …``)."""
    if not marks:
        return ""
    parts = []
    groups = [m[0] for m in marks]
    failed = failed and sum(m[2] is not None for m in marks) == 1
    for group, op, started, completed, backend in marks:
        if started is None:
            continue
        done = finished or (completed is not None and completed >= started)
        name = f"{op} #{started}" if op else f"#{started}"
        label = f"{group} {backend}" if backend and groups.count(group) > 1 else group
        prefix = f"{label}: " if len(marks) > 1 else ""
        parts.append(f"{prefix}{name} {'✗' if failed else '✓' if done else '…'}")
    return "; ".join(parts)


#: The file of torch's collectives (every one's ``wait()``).
_COLLECTIVES = "/torch/distributed/distributed_c10d.py"


def failed_in_collective(view: RankView) -> bool:
    """Whether ``view``'s rank failed with an exception raised in torch's collectives (its
    traceback's innermost frame in ``distributed_c10d.py``: a collective's ``work.wait()``
    on a lost peer), so that its last collective is the one that failed."""
    if view.state != "failed" or not view.traceback:
        return False
    frames = traceback_files(view.traceback[-4000:])
    return bool(frames) and frames[-1].endswith(_COLLECTIVES)


def behind_ranks(state: RunState) -> dict[int, str]:
    """Live ranks that have not started a collective other ranks wait in (for at least
    :data:`BEHIND_AFTER_S`), per process group: rank -> ``behind: …`` (a rank table problem).
    From the heartbeats' Flight Recorder progress; ranks without it are left out, and so is
    a rank that evaluates (:attr:`RankView.activity`): nanoGPT's rank 0 evaluates alone while
    the others wait in the next step's all-reduce, by design, and read ``⚠ behind`` for it.
    The others' collective cells still say what they wait in."""
    live = {r: v for r, v in state.ranks.items() if v.state == "started" and v.collectives}
    waits: dict[tuple[str, str | None], dict[int, tuple[int, str | None]]] = {}
    for rank, view in live.items():
        if (view.still_for or 0.0) < BEHIND_AFTER_S:
            continue
        for group, op, started, completed, backend in view.collectives:
            if started is not None and (completed is None or completed < started):
                waits.setdefault((group, backend), {})[rank] = (started, op)
    out: dict[int, str] = {}
    for (group, backend), waiting in waits.items():
        top = max(seq for seq, _ in waiting.values())
        holders = sorted(r for r, (seq, _) in waiting.items() if seq == top)
        op = next((o for r, (s_, o) in waiting.items() if s_ == top and o), None)
        what = f"{op} #{top}" if op else f"#{top}"
        who = ranks_text(holders)
        for rank, view in live.items():
            mine = [
                m
                for m in view.collectives
                if m[0] == group and m[4] == backend and m[2] is not None
            ]
            if mine and mine[0][2] < top and rank not in out and view.activity != "evaluating":
                out[rank] = f"behind: at #{mine[0][2]} while {who} wait(s) in {what}"
    return out


#: A live rank whose stack stood still this long shows where it is.
STILL_SHOWN_S = 5.0


def where_cell(view: RankView, ended: bool) -> str:
    """The rank's frame, while it prepares, evaluates or stands still (live runs only)."""
    if not ended and view.state == "started" and view.spawned:
        # until their group forms (fits the column)
        return f"spawned {counted(view.spawned, 'worker')}"
    if ended or view.state != "started" or not view.frame:
        return ""
    still = view.still_for or 0.0
    if view.activity not in ("preparing", "evaluating") and still < STILL_SHOWN_S:
        return ""
    waits = f"{view.waiting} ← " if view.waiting else ""
    return f"{waits}{view.frame}"


def attempt_label(state: RunState) -> str:
    """The attempt and why each restart happened; empty for a run that never restarted."""
    refused = f"not restarted: {state.restart_refused}" if state.restart_refused else ""
    if len(state.attempts) < 2:
        return refused
    total = max(state.max_restarts, len(state.attempts) - 1) + 1
    causes = "; ".join(
        f"{record.attempt + 1}: {record.failure.describe(short=True)}"
        for record in state.attempts
        if record.failure is not None
    )
    return f"attempt {state.attempt + 1}/{total}" + (
        f" (failed attempts {causes})" if causes else ""
    )


# -- many ranks, many nodes --------------------------------------------------------------------
#: A single-node run with at most this many ranks keeps its ranks in rank order; larger runs
#: (and every multi-node run) show the worst ranks first.
RANK_ORDER_MAX = 16

#: How bad a rank's state is, worst first (lower is worse).
SEVERITY = (
    "failed",
    "silent",
    "behind",
    "straggler",
    "stopped",
    "pending",
    "preparing",
    "evaluating",
    "started",
    "finished",
)
_SEVERITY_INDEX = {name: i for i, name in enumerate(SEVERITY)}


def severity(row: RankRow) -> str:
    """The row's state as it ranks for attention: ``failed``, ``silent``, ``straggler``,
    or its plain state."""
    if row.state == "failed":
        return "failed"
    if row.problem:
        kind = row.problem.split(":", 1)[0]
        if kind in _SEVERITY_INDEX:
            return kind
    return row.state


def worst_first_key(row: RankRow) -> tuple[int, float, int]:
    """Failed, then silent, then stragglers, then the rest; slowest first within each."""
    return (
        _SEVERITY_INDEX.get(severity(row), len(SEVERITY)),
        -(row.step_time_s or 0.0),
        row.rank,
    )


@dataclass(frozen=True)
class NodeSummary:
    """One node's ranks, aggregated: the rank table's summary row for that node."""

    #: The node's rank, or its host name when the ranks did not say, or None (unknown).
    node: int | str | None
    host: str
    ranks: tuple[int, ...]
    mean_step_time: float | None
    samples_per_s: float
    min_loss: float | None
    max_loss: float | None
    #: The worst state among its ranks (see :data:`SEVERITY`).
    worst: str
    #: How many of its ranks need attention (failed, silent, straggler).
    problems: int

    @property
    def label(self) -> str:
        # Grouped by host when the ranks did not say their node rank: the rank is unknown.
        return f"node {self.node}" if isinstance(self.node, int) else "node ?"

    def loss_range(self) -> str:
        if self.min_loss is None or self.max_loss is None:
            return "--"
        if self.min_loss == self.max_loss:
            return fmt_num(self.min_loss)
        return f"{fmt_num(self.min_loss)}-{fmt_num(self.max_loss)}"


def _group_order(group: int | str | None) -> tuple[int, int, str]:
    if isinstance(group, int):
        return (0, group, "")
    return (1, 0, group) if group is not None else (2, 0, "")


def node_summaries(rows: Sequence[RankRow]) -> tuple[NodeSummary, ...]:
    """A summary per node, in node order, when the ranks run on more than one node (by node
    rank, else by host); empty for a single-node run (or while no rank has said where). Ranks
    that have not said where yet are no node of their own: while a single-node run's ranks
    started, the first to say its host made the table group the ranks into "nodes" (``vm``
    and the ranks still pending), as if the run spanned two machines."""
    groups: dict[int | str | None, list[RankRow]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    if len(groups.keys() - {None}) < 2:
        return ()
    out = []
    for group in sorted(groups, key=_group_order):
        members = groups[group]
        hosts = sorted({r.host for r in members if r.host != "--"})
        times = [r.shown_step_s for r in members if r.shown_step_s is not None]
        losses = [r.loss_value for r in members if r.loss_value is not None]
        severities = [severity(r) for r in members]
        worst = min(severities, key=lambda s: _SEVERITY_INDEX.get(s, 99))
        out.append(
            NodeSummary(
                node=group,
                host=",".join(hosts) if hosts else "--",
                ranks=tuple(r.rank for r in members),
                mean_step_time=sum(times) / len(times) if times else None,
                samples_per_s=sum(r.samples_per_s_value or 0.0 for r in members),
                min_loss=min(losses) if losses else None,
                max_loss=max(losses) if losses else None,
                worst=worst,
                problems=sum(1 for s in severities if s in SEVERITY[:4]),
            )
        )
    return tuple(out)


@dataclass(slots=True)  # not frozen, as RankRow (one per rank per frame)
class TableLine:
    """One line of the rank table: a node's summary (``kind`` "node") or a rank."""

    kind: str
    #: The rank (kind "rank") or the node's position in :attr:`RunFrame.nodes` (kind "node").
    key: int
    cells: tuple[str, ...]
    #: ``severity`` of the rank, or the node's worst.
    severity: str
    row: RankRow | None = None


#: Terminals narrower than this get the screens' compact layouts (the run screen without its
#: system panel, the bench table without its first step and peak RSS columns).
NARROW_BELOW = 100

RANK_COLUMNS = (
    "rank",
    "pid",
    "host",
    "device",
    "epoch/step",
    "loss",
    "samples/s",
    "step time",
    "last seen",
    "state",
    "collective",
    "where",
)
NODE_COLUMNS = ("node", *RANK_COLUMNS)


#: Widest host name in the rank table (longer ones are cut, so the state column stays visible).
HOST_WIDTH = 18


def short(text: str, width: int) -> str:
    """``text``, cut to ``width`` characters with an ellipsis when longer."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _cells(row: RankRow) -> tuple[str, ...]:
    cells = row.cells()
    if len(row.host) <= HOST_WIDTH:
        return cells
    return (*cells[:2], short(row.host, HOST_WIDTH), *cells[3:])


def table_columns(frame: RunFrame) -> tuple[str, ...]:
    return NODE_COLUMNS if frame.nodes else RANK_COLUMNS


def table_lines(frame: RunFrame) -> tuple[TableLine, ...]:
    """The rank table's lines in the order shown.

    A single-node run of up to :data:`RANK_ORDER_MAX` ranks: every rank in rank order (as it
    always was). A larger single-node run: the worst ranks first. A multi-node run: grouped
    by node, each node's summary line above its ranks (worst first); nodes with a failed,
    silent or straggling rank come first, the rest in node order.
    """
    rows = frame.rows
    if not frame.nodes:
        if len(rows) > RANK_ORDER_MAX:
            rows = tuple(sorted(rows, key=worst_first_key))
        return tuple(TableLine("rank", r.rank, _cells(r), severity(r), r) for r in rows)
    by_group: dict[int | str | None, list[RankRow]] = {}
    for row in rows:
        by_group.setdefault(row.group, []).append(row)
    order = sorted(
        range(len(frame.nodes)),
        key=lambda i: (min(_SEVERITY_INDEX.get(frame.nodes[i].worst, 99), 4), i),
    )
    lines = []
    for i in order:
        node = frame.nodes[i]
        lines.append(
            TableLine(
                "node",
                i,
                (
                    node.label,
                    counted(len(node.ranks), "rank"),
                    "",
                    short(node.host, HOST_WIDTH),
                    "",
                    "",
                    node.loss_range(),
                    fmt_per_s(node.samples_per_s),
                    fmt_step_time(node.mean_step_time),
                    "",
                    node.worst,
                    "",
                    "",
                ),
                node.worst,
            )
        )
        members = sorted(by_group.get(node.node, ()), key=worst_first_key)
        lines.extend(
            TableLine(
                "rank",
                r.rank,
                ("" if r.node is None else str(r.node), *_cells(r)),
                severity(r),
                r,
            )
            for r in members
        )
    return tuple(lines)


def _ago(now: float, then: float | None) -> str:
    if then is None:
        return "--"
    age = max(0.0, now - then)
    return f"{age:.1f}s ago" if age < 60 else f"{fmt_duration(age)} ago"


# -- charts -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChartData:
    """Series for the three charts, already thinned to at most MAX_POINTS points each."""

    #: Rank -> (steps, losses).
    loss_by_rank: dict[int, tuple[list[float], list[float]]]
    #: (steps, mean loss over the ranks that reported that step).
    mean_loss: tuple[list[float], list[float]]
    #: (epochs, accuracies) of the evaluations so far.
    accuracy: tuple[list[float], list[float]]
    #: (seconds since start, global samples/s).
    throughput: tuple[list[float], list[float]]
    #: (epochs, losses) of the evaluations that carry a loss.
    eval_loss: tuple[list[float], list[float]] = ([], [])
    #: Epochs planned (None when unknown), for the accuracy chart's x range.
    epochs: int | None = None
    #: Steps (the loss chart's x) at which each restarted attempt began.
    restarts: tuple[float, ...] = ()
    #: No evaluation came although a rank finished an epoch (or the run ended after steps):
    #: the script reports none.
    no_eval: bool = False


def chart_data(state: RunState, max_points: int = MAX_POINTS, per_rank: bool = True) -> ChartData:
    """Copy and thin the series (call with the state's lock held); each rank's own loss line
    only when ``per_rank`` (the loss chart shows the ranks' mean otherwise).

    Thins before any per-point Python work, so the cost stays flat however many points
    the series hold (deque/dict/set copies run at C speed).
    """
    by_rank = {}
    if per_rank:
        for rank, view in sorted(state.ranks.items()):
            points = thin(list(view.loss_series), max_points)
            by_rank[rank] = ([float(s) for s, _ in points], [v for _, v in points])
    steps = thin(sorted(state.loss_steps.items()), max_points)
    mean_x = [float(step) for step, _ in steps]
    mean_y = [at.mean() for _, at in steps]
    # Throughput points per rank: two per bucket, fewer with many ranks (the sum's cost grows
    # with ranks x points; a thinned rank's value is carried forward between its points).
    per_rank = max(max_points // 4, min(2 * max_points, THROUGHPUT_POINTS // len(state.ranks)))
    accuracy, eval_loss = eval_series(state)
    return ChartData(
        loss_by_rank=by_rank,
        mean_loss=(mean_x, mean_y),
        accuracy=accuracy,
        eval_loss=eval_loss,
        throughput=scaled(
            global_throughput(
                [
                    with_pauses(thin(list(v.sps_series), per_rank), v.pauses)
                    for v in state.ranks.values()
                ],
                state.started_at,
                max_points,
            ),
            state.batch_scale,
        ),
        no_eval=not state.evals
        and any(
            v.ended_epoch is not None or (state.outcome == "finished" and v.step)
            for v in state.ranks.values()
        ),
        epochs=state.epochs,
        restarts=tuple(float(a.first_step) for a in state.attempts[1:]),
    )


def eval_series(state: RunState) -> tuple[tuple[list[float], list[float]], ...]:
    """(epochs, accuracies) and (epochs, losses) of the evaluations so far. An epoch's n
    evaluations (every N steps: the HF Trainer's ``eval_steps``) sit at epoch, epoch + 1/n,
    ...; one an epoch at its epoch; those without an epoch at 1, 2, ... in order. The epoch as
    the header and the lines show it (:func:`epoch_ordinal`): a script counting from 0 with
    2 epochs known has its evaluations at 1 and 2 (``epoch 1/2``, ``2/2``), not at 0 and 1."""
    history = state.eval_history
    per_epoch, seen = Counter(p.epoch for p in history), Counter()
    accuracy: tuple[list[float], list[float]] = ([], [])
    loss: tuple[list[float], list[float]] = ([], [])
    for i, point in enumerate(history):
        if point.epoch is None:
            x = float(i + 1)
        else:
            x = epoch_ordinal(state, point.epoch) + seen[point.epoch] / per_epoch[point.epoch]
            seen[point.epoch] += 1
        for series, value in ((accuracy, point.accuracy), (loss, point.loss)):
            if value is not None:
                series[0].append(x)
                series[1].append(float(value))
    return accuracy, loss


def thin(points: Sequence[Any], max_points: int) -> list[Any]:
    """Every k-th point so at most ``max_points`` remain (always keeping the last)."""
    n = len(points)
    if n <= max_points:
        return list(points)
    stride = -(-n // max_points)
    kept = list(points[n - 1 :: -stride])
    kept.reverse()
    return kept


def with_pauses(
    points: list[tuple[float, float]], pauses: Iterable[tuple[float, float, float]]
) -> list[tuple[float, float]]:
    """A rank's (thinned) throughput points with its pauses put in: 0 from each pause's start
    and the rate of the step that ended it from its end (thinning may have dropped that step;
    no point of the series falls inside a pause). Pauses before the first point are left out
    (the series forgot that time)."""
    if not points:
        return points
    first = points[0][0]
    for start, end, rate in pauses:
        if start < first:
            continue
        i = bisect.bisect_left(points, start, key=itemgetter(0))
        points[i:i] = [(start, 0.0), (end, rate)]
    return points


def scaled(
    series: tuple[list[float], list[float]], scale: float
) -> tuple[list[float], list[float]]:
    """A (times, values) series with its values times ``scale`` (the run's share of the
    ranks' samples: ``RunState.batch_scale``)."""
    if scale == 1.0:
        return series
    times, values = series
    return times, [value * scale for value in values]


def global_throughput(
    series: Iterable[Sequence[tuple[float, float]]],
    start: float | None,
    max_points: int = MAX_POINTS,
) -> tuple[list[float], list[float]]:
    """Sum of the ranks' samples/s over time, from their (time, samples/s) series.

    Time is cut into equal buckets; each rank contributes its latest value in a bucket, carried
    forward through buckets where it reported nothing (a slow step) until its last report.
    """
    series = [s for s in series if s]
    if not series:
        return [], []
    t0 = start if start is not None else min(s[0][0] for s in series)
    t1 = max(s[-1][0] for s in series)
    span = max(t1 - t0, 1e-9)
    buckets = min(max_points, max(1, int(span / MIN_BUCKET_S) + 1))
    width = span / buckets
    top = buckets - 1
    # A rank's contribution is a step function over the buckets (its latest value, carried
    # forward to its last report): kept as its changes, each rank costs its points, not the
    # buckets (the hot loop of the charts at scale, 256 ranks x 62 points x 240 buckets).
    changes = [0.0] * (buckets + 1)
    carried = [0.0] * buckets  # ranks whose times go back, or whose values are not finite
    for points in series:
        ends: list[tuple[int, float]] = []  # (bucket, the rank's latest value in it)
        bucket = -1
        latest = 0.0
        for t, value in points:
            i = int((t - t0) / width)
            i = top if i > top else 0 if i < 0 else i
            if i != bucket:
                if i < bucket:
                    break  # a clock that went back
                if bucket >= 0:
                    ends.append((bucket, latest))
                bucket = i
            latest = value
        else:
            ends.append((bucket, latest))
            if sum(v for _, v in ends) * 0.0 == 0.0:  # every value finite (no NaN, no inf)
                level = 0.0
                for i, value in ends:
                    changes[i] += value - level
                    level = value
                changes[bucket + 1] -= level
                continue
        _add_carried(carried, points, t0, width)
    totals = []
    level = 0.0
    for i in range(buckets):
        level += changes[i]
        totals.append(level + carried[i])
    xs = [round((i + 1) * width, 3) for i in range(buckets)]
    return xs, totals


def _add_carried(
    totals: list[float], points: Sequence[tuple[float, float]], t0: float, width: float
) -> None:
    """Add one rank's latest value per bucket, carried through buckets where it reported
    nothing, from its first to its last report, into ``totals`` (one pass over the buckets)."""
    top = len(totals) - 1
    values: list[float | None] = [None] * len(totals)
    for t, value in points:
        i = int((t - t0) / width)
        values[top if i > top else 0 if i < 0 else i] = value
    last_bucket = min(top, max(0, int((points[-1][0] - t0) / width)))
    first_bucket = min(top, max(0, int((points[0][0] - t0) / width)))
    carry = None
    for i in range(first_bucket, last_bucket + 1):
        value = values[i]
        if value is not None:
            carry = value
        if carry is not None:
            totals[i] += carry
