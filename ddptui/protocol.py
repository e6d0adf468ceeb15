"""The telemetry wire protocol: typed, versioned events; encode, decode, validate.

Ranks send events as msgpack over ZeroMQ, a batch (a list of events) per message; ddptui
writes the same events as JSON lines (``events.jsonl``). Nothing here ever unpickles:
decoding is schema-driven (msgspec), so a message is either a batch of well-formed events
of known kinds or it is rejected whole.

Every event carries ``v`` (schema version), ``run`` (run id), ``rank``, ``kind``, ``t``
(wall-clock seconds since the epoch, for display) and ``seq`` (a per-rank counter; a gap in
it means events were dropped on the way).

Two layers of checks: the schema (types, sizes; a message that fails it is rejected whole)
and :func:`implausible` (values: a rank outside the run, a negative or non-finite duration
or rate), applied per event by the collector.

``events.jsonl`` is strict JSON. A float that is not finite (a diverging loss) is written as
the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` and read back as that float.
"""

from __future__ import annotations

import math
import operator
import types
import typing
from collections.abc import Iterable
from typing import Annotated, Literal

import msgspec

from ddptui.constants import MAX_STEPS_PER_EVENT

SCHEMA_VERSION = 1
#: Largest message accepted from a socket; anything bigger is counted as oversized.
MAX_MESSAGE_BYTES = 1024 * 1024
#: Most events a sender puts in one message.
MAX_BATCH_EVENTS = 256
#: Most extra metrics one event may carry.
MAX_METRICS = 64
#: Longest error message and Python traceback a failed status may carry (characters).
MAX_ERROR_CHARS = 4_000
MAX_TRACEBACK_CHARS = 16_000
#: Largest plausible value of a duration (s) or a throughput (samples/s) in an event.
MAX_SECONDS = 1e9
MAX_RATE = 1e12

NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
StepCount = Annotated[int, msgspec.Meta(ge=1, le=MAX_STEPS_PER_EVENT)]
#: Highest attempt number an event may carry (``--max-restarts`` allows at most 100).
MAX_ATTEMPT = 1_000
Metric = float | int | str | bool | None
Metrics = Annotated[dict[str, Metric], msgspec.Meta(max_length=MAX_METRICS)]
#: Most phases one step may carry (the built-in ones and a few custom ``ddptui.phase``).
MAX_PHASES = 16
#: Longest phase name.
MAX_PHASE_NAME = 32
#: Longest phase duration accepted, in seconds.
MAX_PHASE_S = 1e6
PhaseName = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_PHASE_NAME)]
PhaseSeconds = Annotated[float, msgspec.Meta(ge=0, le=MAX_PHASE_S)]
Phases = Annotated[dict[PhaseName, PhaseSeconds], msgspec.Meta(max_length=MAX_PHASES)]


class Event(msgspec.Struct, tag_field="kind", kw_only=True, omit_defaults=False):
    """Fields shared by every event."""

    v: Literal[1] = SCHEMA_VERSION  # another version fails validation
    run: Annotated[str, msgspec.Meta(max_length=128)]
    rank: NonNegInt
    t: float
    seq: NonNegInt
    #: Which attempt of the run sent it (0 first, +1 per ``--max-restarts`` restart); ``seq``
    #: counts within one rank's attempt.
    attempt: Annotated[int, msgspec.Meta(ge=0, le=MAX_ATTEMPT)] = 0


RankState = Literal["started", "finished", "failed"]


class Status(Event, tag="status"):
    """A rank's lifecycle: started (with where it runs), finished, or failed (with why)."""

    state: RankState
    pid: int | None = None
    host: str | None = None
    local_rank: int | None = None
    world_size: int | None = None
    #: Planned number of epochs (for progress and ETA), when the script knows it.
    epochs: int | None = None
    #: Training steps per epoch on this rank, when the script knows it (progress from step 1).
    steps_per_epoch: int | None = None
    device: str | None = None
    device_uuid: str | None = None
    error: Annotated[str, msgspec.Meta(max_length=MAX_ERROR_CHARS)] | None = None
    #: The Python traceback of a failure, when the rank has one (its last characters).
    traceback: Annotated[str, msgspec.Meta(max_length=MAX_TRACEBACK_CHARS)] | None = None
    #: Events this rank's reporter had to drop (queue full or nobody listening).
    dropped: int | None = None
    #: The node rank (torch's ``GROUP_RANK``) in a multi-node run; None on a single node.
    node: int | None = None


#: Most GPUs one node sample may describe.
MAX_NODE_GPUS = 64
ShortText = Annotated[str, msgspec.Meta(max_length=128)]
#: Longest frame description (``func (file.py:line)``) a heartbeat carries.
MAX_FRAME_CHARS = 300
#: Most process groups one heartbeat describes.
MAX_BEAT_GROUPS = 16


class CollectiveMark(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A rank's progress through one process group's collectives (torch's Flight Recorder):
    the last one it started (its op and sequence number) and the last one that completed, on
    one backend (each backend of a group numbers its collectives itself)."""

    pg: ShortText
    op: ShortText | None = None
    started: NonNegInt | None = None
    completed: NonNegInt | None = None
    #: The recorder's backend (``gloo``, ``nccl``); None from a rank that did not say.
    backend: ShortText | None = None


class Beat(Event, tag="beat"):
    """A rank's heartbeat, every few seconds from a thread of its own (it needs nothing of the
    main thread, which may be blocked in a collective): where the main thread is, whether its
    stack moved, the process's CPU time, and its collectives. It is the evidence a hang
    verdict stands on: a stack that has not moved while the CPU idles. Its ``seq`` repeats the
    rank's last one (beats are not counted: a lost beat is no dropped event)."""

    #: The script's innermost frame of the main thread, ``func (file.py:line)``.
    frame: Annotated[str, msgspec.Meta(max_length=MAX_FRAME_CHARS)] | None = None
    #: The collective the main thread waits in (``all_reduce``, ``barrier``…), if any.
    waiting: ShortText | None = None
    #: False: the rank's hooks know it holds no DDP module (yet), so a ``backward()`` in its
    #: stack is its own work, not a wait for the gradient all-reduce. None: not known.
    ddp: Literal[False] | None = None
    #: A digest of the main thread's whole stack: unchanged means the stack has not moved.
    digest: Annotated[str, msgspec.Meta(max_length=32)] | None = None
    #: CPU seconds the process and its live descendants have used (all threads).
    cpu: float | None = None
    #: Bytes the process and its descendants have read and written (``/proc/<pid>/io`` of each:
    #: ``rchar`` + ``wchar`` + ``read_bytes`` + ``write_bytes``: files, pipes, TLS connections
    #: and storage), where the kernel counts them, and what the process's TCP connections
    #: moved between beats of one unmoved stack (plain sockets). Only its growth is read.
    io: NonNegInt | None = None
    #: Steps the rank has taken so far (0: still preparing).
    steps: NonNegInt = 0
    #: Evaluation batches the rank has run so far, by its hooks (its DDP module's forwards
    #: with grad off or in eval mode, and the batches drawn for them): grown since its last
    #: beat with no step between, the rank evaluates. 0 without the hooks (and in older
    #: runs' beats).
    evaluations: NonNegInt = 0
    collectives: Annotated[list[CollectiveMark], msgspec.Meta(max_length=MAX_BEAT_GROUPS)] = []
    #: How many times the sampled thread (the one ``frame`` is of) has slept and woken so far:
    #: its voluntary context switches (``/proc/self/task/<tid>/status``). A thread blocked in
    #: one call (a lock, a read, one long sleep) wakes no more; a loop that waits a moment at a
    #: time (polling for a file) wakes each time round, its stack sampled at the same line.
    #: Only its growth is read. None: not known (another system, an older ddptui).
    wakes: NonNegInt | None = None


class Step(Event, tag="step"):
    """One training step on one rank."""

    step: NonNegInt
    epoch: int | None = None
    loss: float | None = None
    samples: NonNegInt = 0
    samples_per_s: float | None = None
    step_time: float | None = None
    metrics: Metrics = {}
    #: Seconds of this step (or of the steps since the last explicit log) per phase: the
    #: built-in ones (``constants.PHASES``, which partition the step) and custom ones
    #: (``ddptui.phase``, which overlap them). None when nothing measured the phases.
    phases: Phases | None = None
    #: How many optimizer steps the event stands for: the zero-code hooks send the steps of
    #: a very fast script a few at a time (under 5 ms each, up to 25 ms of them in one
    #: event), so that its record and the dashboard keep up. ``step`` is the last one's
    #: number; ``samples``, ``step_time`` and ``phases`` are their sums; ``loss`` is the last
    #: one's. 1 for every other step event.
    steps: StepCount = 1


class Eval(Event, tag="eval"):
    """An all-reduced evaluation (the same values on every rank)."""

    epoch: int | None = None
    accuracy: float | None = None
    loss: float | None = None
    count: int | None = None
    metrics: Metrics = {}


class EpochEnd(Event, tag="epoch"):
    """End of one training epoch on one rank."""

    epoch: int
    time: float
    samples: NonNegInt


class LogLine(Event, tag="log"):
    """A line of worker output."""

    stream: Literal["stdout", "stderr"]
    line: Annotated[str, msgspec.Meta(max_length=4096)]


class GpuSample(msgspec.Struct, kw_only=True, omit_defaults=False):
    """One GPU of a node sample (None: the field is not available there)."""

    index: NonNegInt
    name: ShortText | None = None
    util: float | None = None  # percent
    mem_used: NonNegInt | None = None  # bytes
    mem_total: NonNegInt | None = None  # bytes
    temp: int | None = None  # degrees C
    power: float | None = None  # watts


class NodeSample(Event, tag="node"):
    """A multi-node run's system sample of one node (host load, GPUs), sent by its ``ddptui
    join`` agent. ``rank`` is unused (0); ``node`` is the agent's node slot."""

    node: NonNegInt
    host: ShortText | None = None
    cpu_percent: float | None = None
    load1: float | None = None
    mem_used: NonNegInt | None = None
    mem_total: NonNegInt | None = None
    gpus: Annotated[list[GpuSample], msgspec.Meta(max_length=MAX_NODE_GPUS)] = []
    #: Why there are no GPUs (no NVIDIA driver, say).
    gpu_reason: Annotated[str, msgspec.Meta(max_length=200)] | None = None


#: Largest world a run may grow to when a script spawns its own ranks (ddptui.rank.spawned).
MAX_GROWN_WORLD = 1024
#: What a note may be about (``Note.code``).
NoteCode = Literal[
    "sampler_epoch",
    "spawned",
    "loader_steps",
    "p2p",
    "own_group",
    "first_batch",
    "local_rank_arg",
    "alone",
    "accelerate_alone",
    "instrument_off",
    "workers_formed",
    "loader_restart",
    "data_parallel",
    "summed_loss",
]
#: Largest number a note carries (an epoch, a count of passes).
MAX_NOTE_NUMBER = 1_000_000_000
#: A ``first_batch`` note's digest: 53 bits (a JSON reader's exact integers).
MAX_DIGEST = 2**53 - 1
NoteNumber = Annotated[int, msgspec.Meta(ge=0, le=MAX_NOTE_NUMBER)]


class Note(Event, tag="note"):
    """Something a rank noticed that is worth telling but is no failure: a code and a few
    bounded numbers, never text (ddptui composes the sentence, so no rank, and no forged
    event, puts words of its own on the user's screen). Sent once per process and code.

    ``sampler_epoch``: a ``DistributedSampler(shuffle=True)`` never told its epoch
    (``set_epoch``) started pass ``passes`` (2 or more) at the same ``epoch`` as its previous
    pass: every epoch shuffles in the same order.

    ``spawned``: this process spawned ``workers`` workers (``torch.multiprocessing``); they are
    the run's ranks once their process group forms, and it only waits for them from now on.

    ``loader_steps``: a pass over the DataLoader this rank trains from makes ``steps`` steps
    (its batches a pass, divided by the batches a step draws): an epoch's length, until the
    run shows one.

    ``p2p``: this rank called a point-to-point op (``send``, ``recv``, ``isend``, ``irecv``,
    ``batch_isend_irecv``): it communicates beyond what its Flight Recorder's collective
    progress shows (gloo's records no point-to-point op), so no rank is said to train apart.

    ``own_group``: this rank, launched as a rank of the run's world, formed its process group
    as rank ``group_rank`` of ``group_size`` ranks, another world than the launcher's: the
    script took its rank and world size from elsewhere (``slurm``: a Slurm job's variables
    are in its environment, which scripts made for ``srun`` read before torchrun's). It
    keeps its launched rank on the dashboard.

    ``first_batch``: this rank, in a world of several, trains from a DataLoader with no
    DistributedSampler (torch's ``RandomSampler`` or ``SequentialSampler`` over a map-style
    dataset); ``digest`` is a hash of the first batch it drew (its tensors' dtypes, shapes and
    first values) and of what its first training forward took of it (a rank's own slice of
    one batch is other work), which the ranks' notes compare.

    ``local_rank_arg``: the script's argument parser has a ``--local_rank`` option
    (``--local-rank`` where ``dashed``) that no launcher passed it: it read ``read`` (None:
    no whole number, its default None say) where the rank's ``LOCAL_RANK`` is
    ``local_rank``. Said beside a failure only. Sent again with ``read`` equal to
    ``local_rank`` once the script has set the option's attribute to it itself (timm's
    ``train.py``): the note is taken back.

    ``alone``: this rank, launched as one of a world of several, took its first training step
    with no process group (``torch.distributed`` not initialized, no RPC agent): it trains by
    itself. With ``group_size``: it formed a group of that size after all (the first one is
    taken back).

    ``accelerate_alone``: this rank formed the world's process group, but HF accelerate runs
    it as a process of its own (``DistributedType.NO``): no DDP module, no data sharded.

    ``instrument_off``: ddptui's step instrumentation in this rank turned itself off after an
    internal error (its log has the error): the rank trains on, but its steps, samples and
    phases are no longer reported (``ddptui.log`` calls still are).

    ``workers_formed``: a process this one started with ``multiprocessing.Process`` formed a
    process group of ``workers`` ranks: its workers are ranks, and it only waits for them from
    now on (sent as it goes quiet; unlike ``spawned`` it follows its workers' own events).

    ``loader_restart``: pass ``passes`` over the DataLoader this rank trains from waited
    ``seconds`` for its first batch, its ``workers`` workers started anew (the loader keeps
    none between passes: ``persistent_workers`` False), a large share of the pass before.

    ``data_parallel``: this rank's world trains on ``group_size`` batches at a time, fewer
    than its ranks: it is data-parallel over that many (its DDP module's process group, the
    device mesh ``fully_shard`` shards it over, or the world over the mesh a tensor-parallel
    ``parallelize_module`` splits it over), and the others (tensor, pipeline or context
    parallel) train on the same batches as it: the run's samples count each batch once. Said
    again when a rank learns a smaller number.

    ``summed_loss``: FSDP sums this rank's gradients over ``group_size`` ranks (its
    ``set_gradient_divide_factor(1.0)``): the script made each rank's loss its share of theirs
    (torchtitan divides a rank's summed token losses by all the ranks' tokens), so the rank
    reports its loss times ``group_size``, and the ranks' mean is the script's."""

    code: NoteCode
    epoch: NoteNumber | None = None
    passes: Annotated[int, msgspec.Meta(ge=2, le=MAX_NOTE_NUMBER)] | None = None
    workers: Annotated[int, msgspec.Meta(ge=1, le=MAX_GROWN_WORLD)] | None = None
    steps: Annotated[int, msgspec.Meta(ge=1, le=MAX_NOTE_NUMBER)] | None = None
    group_rank: Annotated[int, msgspec.Meta(ge=0, le=MAX_NOTE_NUMBER)] | None = None
    group_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_NOTE_NUMBER)] | None = None
    slurm: bool | None = None
    digest: Annotated[int, msgspec.Meta(ge=0, le=MAX_DIGEST)] | None = None
    local_rank: Annotated[int, msgspec.Meta(ge=0, le=MAX_NOTE_NUMBER)] | None = None
    read: Annotated[int, msgspec.Meta(ge=-MAX_NOTE_NUMBER, le=MAX_NOTE_NUMBER)] | None = None
    dashed: bool | None = None
    seconds: NoteNumber | None = None


AnyEvent = Status | Step | Eval | EpochEnd | LogLine | NodeSample | Beat | Note
KINDS = ("status", "step", "eval", "epoch", "log", "node", "beat", "note")

_msgpack_encoder = msgspec.msgpack.Encoder()
_batch_decoder = msgspec.msgpack.Decoder(
    Annotated[list[AnyEvent], msgspec.Meta(max_length=MAX_BATCH_EVENTS)]
)
_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder(AnyEvent)
#: A message's events undecoded, each to be decoded alone (see :func:`decode_each`).
_raw_batch_decoder = msgspec.msgpack.Decoder(
    Annotated[list[msgspec.Raw], msgspec.Meta(max_length=MAX_BATCH_EVENTS)]
)
_event_decoder = msgspec.msgpack.Decoder(AnyEvent)


def clean_phases(phases: object) -> dict[str, float] | None:
    """``phases`` as the wire accepts them: string names (cut to MAX_PHASE_NAME), finite
    durations in 0..MAX_PHASE_S seconds, at most MAX_PHASES of them; anything else is left
    out (one bad value never costs the whole step event). None when nothing is left."""
    if not isinstance(phases, dict):
        return None
    out: dict[str, float] = {}
    for name, value in phases.items():
        if len(out) >= MAX_PHASES:
            break
        if type(value) is float:  # the usual case (the hooks' own phases): no conversion
            seconds = value
        elif isinstance(value, bool):
            continue
        else:
            try:
                seconds = float(value)
            except (TypeError, ValueError, OverflowError):
                continue
        if 0.0 <= seconds <= MAX_PHASE_S and isinstance(name, str) and name:  # NaN: False
            out[name[:MAX_PHASE_NAME]] = seconds
    return out or None


class InvalidEvent(ValueError):
    """A message that is not a valid batch of events of this schema version."""


def _float_fields(cls: type) -> tuple[str, ...]:
    """Names of the fields of ``cls`` that may hold a float."""
    hints = typing.get_type_hints(cls, include_extras=True)
    names = []
    for name in cls.__struct_fields__:
        hint = hints[name]
        while typing.get_origin(hint) is Annotated:
            hint = typing.get_args(hint)[0]
        members = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        if float in members:
            names.append(name)
    return tuple(names)


_FLOAT_FIELDS: dict[type, tuple[str, ...]] = {
    cls: _float_fields(cls)
    for cls in (Status, Step, Eval, EpochEnd, LogLine, NodeSample, Beat, Note)
}
_KIND_FLOAT_FIELDS = {cls.__struct_config__.tag: f for cls, f in _FLOAT_FIELDS.items()}
#: The float fields' values of an event, as a tuple (one getter per kind: to_json is hot).
_FLOAT_VALUES = {
    cls: operator.attrgetter(*f) if len(f) > 1 else (lambda e, n=f[0]: (getattr(e, n),))
    for cls, f in _FLOAT_FIELDS.items()
}
#: How a non-finite float is spelled in events.jsonl (names that JavaScript's Number() and
#: Python's float() both read).
_STR_TO_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _spell(value: float) -> str:
    """The spelling of a non-finite float."""
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _spelled_metrics(metrics: dict[str, Metric]) -> dict[str, Metric] | None:
    """``metrics`` with non-finite floats spelled out, or None when there are none."""
    for value in metrics.values():
        if type(value) is float and not math.isfinite(value):
            return {
                k: _spell(v) if type(v) is float and not math.isfinite(v) else v
                for k, v in metrics.items()
            }
    return None


def _unspell_metrics(metrics: dict[str, Metric]) -> None:
    for key, value in metrics.items():
        if type(value) is str and value in _STR_TO_NONFINITE:
            metrics[key] = _STR_TO_NONFINITE[value]


def implausible(event: AnyEvent, world_size: int | None = None) -> str | None:
    """Why a schema-valid event cannot be true (a rank outside the run, a negative or
    non-finite time, duration, rate or count), or None when it is plausible.

    A loss or accuracy may be anything, NaN included: that is what training produced."""
    if world_size is not None and event.rank >= world_size:
        return f"rank {event.rank} outside world size {world_size}"
    if not math.isfinite(event.t):
        return "non-finite time"
    kind = type(event)
    if kind is Step:  # the hot path: most events are steps
        step_time, rate = event.step_time, event.samples_per_s
        if step_time is not None and not 0.0 <= step_time <= MAX_SECONDS:  # False for NaN
            return f"step_time {step_time!r}"
        if rate is not None and not 0.0 <= rate <= MAX_RATE:
            return f"samples_per_s {rate!r}"
        if event.epoch is not None and event.epoch < 0:
            return f"epoch {event.epoch}"
    elif kind is EpochEnd:
        if not 0.0 <= event.time <= MAX_SECONDS:
            return f"epoch time {event.time!r}"
        if event.epoch < 0:
            return f"epoch {event.epoch}"
    elif kind is Eval:
        if event.count is not None and event.count < 0:
            return f"count {event.count}"
    elif kind is Status:
        for name in ("pid", "local_rank", "epochs", "steps_per_epoch", "dropped", "node"):
            value = getattr(event, name)
            if value is not None and value < 0:
                return f"{name} {value}"
        if event.world_size is not None and event.world_size < 1:
            return f"world_size {event.world_size}"
        if event.local_rank is not None and event.world_size is not None:
            if event.local_rank >= event.world_size:
                return f"local_rank {event.local_rank} outside world size {event.world_size}"
    elif kind is NodeSample:
        return _implausible_node(event)
    elif kind is Beat:
        if event.cpu is not None and not 0.0 <= event.cpu <= MAX_SECONDS:
            return f"cpu {event.cpu!r}"
    return None


def _implausible_node(event: NodeSample) -> str | None:
    """A node sample's numbers must be finite and in range (they are drawn, not trusted)."""
    if event.cpu_percent is not None and not 0.0 <= event.cpu_percent <= 100.0:
        return f"cpu_percent {event.cpu_percent!r}"
    if event.load1 is not None and not 0.0 <= event.load1 <= 1e6:
        return f"load1 {event.load1!r}"
    for gpu in event.gpus:
        if gpu.util is not None and not 0.0 <= gpu.util <= 100.0:
            return f"gpu {gpu.index} util {gpu.util!r}"
        if gpu.power is not None and not 0.0 <= gpu.power <= 1e5:
            return f"gpu {gpu.index} power {gpu.power!r}"
        if gpu.temp is not None and not -100 <= gpu.temp <= 1000:
            return f"gpu {gpu.index} temp {gpu.temp!r}"
    return None


def grown_world(event: AnyEvent, world_size: int) -> int | None:
    """The larger world size a rank announces when the script spawned its own ranks (a
    ``started`` status whose ``world_size`` exceeds the run's, with its rank inside it, up to
    :data:`MAX_GROWN_WORLD`), else None."""
    if type(event) is not Status or event.state != "started" or event.world_size is None:
        return None
    if world_size < event.world_size <= MAX_GROWN_WORLD and event.rank < event.world_size:
        return event.world_size
    return None


def encode_batch(events: list[AnyEvent]) -> bytes:
    """Wire encoding of one message: a msgpack list of events."""
    return _msgpack_encoder.encode(events)


def decode_batch(data: bytes) -> list[AnyEvent]:
    """Decode and validate one wire message; raise :class:`InvalidEvent` unless every event
    in it is valid (a message is accepted or rejected whole)."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise InvalidEvent(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        return _batch_decoder.decode(data)
    except Exception as exc:  # DecodeError, ValidationError, UnicodeDecodeError, anything
        raise InvalidEvent(f"{type(exc).__name__}: {exc}") from None


def decode_each(data: bytes) -> tuple[list[AnyEvent], int]:
    """A message :func:`decode_batch` refused, event by event: (the valid events, how many
    were not). One invalid event (a script's ``epoch="1"``) refused the whole message, and
    with it every step batched beside it. A message that is no list of events at all (or over
    the limits) is all invalid: ``([], 1)``."""
    if len(data) > MAX_MESSAGE_BYTES:
        return [], 1
    try:
        raws = _raw_batch_decoder.decode(data)
    except Exception:  # noqa: BLE001 - not a msgpack list of at most MAX_BATCH_EVENTS
        return [], 1
    events: list[AnyEvent] = []
    for raw in raws:
        try:
            events.append(_event_decoder.decode(raw))
        except Exception:  # noqa: BLE001 - this event only
            continue
    return events, len(raws) - len(events)


def to_json(event: AnyEvent) -> bytes:
    """One ``events.jsonl`` line (without the newline); strict JSON, with non-finite floats
    spelled ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``."""
    changes: dict[str, object] | None = None
    isfinite = math.isfinite
    for value in _FLOAT_VALUES[type(event)](event):
        if value is not None and not isfinite(value):
            changes = {
                name: _spell(v)
                for name in _FLOAT_FIELDS[type(event)]
                if (v := getattr(event, name)) is not None and not isfinite(v)
            }
            break
    metrics = getattr(event, "metrics", None)
    if metrics:
        spelled = _spelled_metrics(metrics)
        if spelled is not None:
            changes = changes or {}
            changes["metrics"] = spelled
    if changes:
        event = msgspec.structs.replace(event, **changes)
    return _json_encoder.encode(event)


def to_json_lines(events: Iterable[AnyEvent]) -> bytes:
    """``events.jsonl`` lines for ``events``: each :func:`to_json` line and a newline, made
    by one encoder call when no float needs spelling out (the usual case: the dashboard
    writes a few thousand events a second at 256 ranks, and a call per event was most of
    the cost)."""
    events = list(events)
    isfinite, getters = math.isfinite, _FLOAT_VALUES
    for event in events:
        for value in getters[type(event)](event):
            if value is not None and not isfinite(value):
                return b"".join(to_json(e) + b"\n" for e in events)
        metrics = getattr(event, "metrics", None)
        if metrics and _spelled_metrics(metrics) is not None:
            return b"".join(to_json(e) + b"\n" for e in events)
    return _json_encoder.encode_lines(events)


def from_json(line: bytes | str) -> AnyEvent:
    """Parse one ``events.jsonl`` line; raise :class:`InvalidEvent` if it is not an event."""
    try:
        event = _json_decoder.decode(line)
    except msgspec.ValidationError:
        event = _from_json_spelled(line)  # a float field spelled as a string, or invalid
    except Exception as exc:
        raise InvalidEvent(f"{type(exc).__name__}: {exc}") from None
    metrics = getattr(event, "metrics", None)
    if metrics:
        _unspell_metrics(metrics)
    return event


def _from_json_spelled(line: bytes | str) -> AnyEvent:
    """The slow path of :func:`from_json`: read the line untyped, turn spelled non-finite
    floats back into floats, then validate."""
    try:
        raw = msgspec.json.decode(line)
        if isinstance(raw, dict):
            for name in _KIND_FLOAT_FIELDS.get(raw.get("kind"), ()):
                value = raw.get(name)
                if type(value) is str and value in _STR_TO_NONFINITE:
                    raw[name] = _STR_TO_NONFINITE[value]
        return msgspec.convert(raw, AnyEvent)
    except Exception as exc:
        raise InvalidEvent(f"{type(exc).__name__}: {exc}") from None
