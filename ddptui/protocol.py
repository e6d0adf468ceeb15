"""The telemetry wire protocol: typed, versioned events; encode, decode, validate.

Ranks send events as msgpack over ZeroMQ, a batch (a list of events) per message; ddptui
writes the same events as JSON lines (``events.jsonl``). Nothing here ever unpickles:
decoding is schema-driven (msgspec), so a message is either a batch of well-formed events
of known kinds or it is rejected whole.

Every event carries ``v`` (schema version), ``run`` (run id), ``rank``, ``kind``, ``t``
(wall-clock seconds since the epoch, for display) and ``seq`` (a per-rank counter; a gap in
it means events were dropped on the way).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

SCHEMA_VERSION = 1
#: Largest message accepted from a socket; anything bigger is counted as oversized.
MAX_MESSAGE_BYTES = 1024 * 1024
#: Most events a sender puts in one message.
MAX_BATCH_EVENTS = 256
#: Most extra metrics one event may carry.
MAX_METRICS = 64

NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
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
    error: str | None = None
    #: Events this rank's reporter had to drop (queue full or nobody listening).
    dropped: int | None = None


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


AnyEvent = Status | Step | Eval | EpochEnd | LogLine
KINDS = ("status", "step", "eval", "epoch", "log")

_msgpack_encoder = msgspec.msgpack.Encoder()
_batch_decoder = msgspec.msgpack.Decoder(
    Annotated[list[AnyEvent], msgspec.Meta(max_length=MAX_BATCH_EVENTS)]
)
_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder(AnyEvent)


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
        if not isinstance(name, str) or not name or isinstance(value, bool):
            continue
        try:
            seconds = float(value)
        except (TypeError, ValueError, OverflowError):
            continue
        if 0.0 <= seconds <= MAX_PHASE_S:  # False for NaN
            out[name[:MAX_PHASE_NAME]] = seconds
    return out or None


class InvalidEvent(ValueError):
    """A message that is not a valid batch of events of this schema version."""


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
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidEvent(str(exc)) from None


def to_json(event: AnyEvent) -> bytes:
    """One ``events.jsonl`` line (without the newline)."""
    return _json_encoder.encode(event)


def from_json(line: bytes | str) -> AnyEvent:
    """Parse one ``events.jsonl`` line; raise :class:`InvalidEvent` if it is not an event."""
    try:
        return _json_decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidEvent(str(exc)) from None
