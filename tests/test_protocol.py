import json
import math
import random

import msgspec
import pytest

from ddptui import protocol

BASE = dict(run="r1", rank=0, t=1.0, seq=0)


@pytest.mark.parametrize(
    "event",
    [
        protocol.Status(state="started", pid=1, host="h", local_rank=0, device="cpu", **BASE),
        protocol.Status(state="failed", error="boom", **BASE),
        protocol.Step(
            step=3,
            epoch=1,
            loss=0.5,
            samples=32,
            samples_per_s=100.0,
            step_time=0.32,
            metrics={"lr": 0.1, "tag": "x"},
            **BASE,
        ),
        protocol.Eval(epoch=2, accuracy=0.97, loss=0.1, count=1001, **BASE),
        protocol.EpochEnd(epoch=1, time=3.5, samples=4000, **BASE),
        protocol.LogLine(stream="stderr", line="warning", **BASE),
    ],
)
def test_round_trip_wire_and_json(event):
    assert protocol.decode_batch(protocol.encode_batch([event])) == [event]
    assert protocol.from_json(protocol.to_json(event)) == event


def test_a_batch_keeps_order_and_kinds():
    events = [protocol.Step(step=i, **{**BASE, "seq": i}) for i in range(5)]
    events.append(protocol.Eval(accuracy=0.5, **{**BASE, "seq": 5}))
    assert protocol.decode_batch(protocol.encode_batch(events)) == events


def test_json_line_has_public_field_names():
    line = protocol.to_json(protocol.Step(step=1, loss=0.5, samples=8, **BASE))
    data = msgspec.json.decode(line)
    assert data["kind"] == "step" and data["rank"] == 0
    assert {"loss", "samples", "samples_per_s", "step_time", "epoch", "seq", "t", "v"} <= set(data)


GOOD = {"kind": "step", "step": 1, **BASE}


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x00\x01garbage",
        msgspec.msgpack.encode(GOOD),  # an event, not a batch
        msgspec.msgpack.encode([{"kind": "nope", **BASE}]),
        msgspec.msgpack.encode([{"kind": "step", **BASE}]),  # step missing
        msgspec.msgpack.encode([{"kind": "step", "step": -1, **BASE}]),
        msgspec.msgpack.encode([{"kind": "step", "step": 1, "loss": "high", **BASE}]),
        msgspec.msgpack.encode([{"kind": "status", "state": "sleeping", **BASE}]),
        msgspec.msgpack.encode([{"kind": "status", "state": "started", **{**BASE, "rank": -2}}]),
        msgspec.msgpack.encode([{"kind": "eval", "v": 99, **BASE}]),
        msgspec.msgpack.encode([{"kind": "beat", "io": -1, **BASE}]),  # storage bytes < 0
        msgspec.msgpack.encode([{"kind": "beat", "io": "lots", **BASE}]),
        msgspec.msgpack.encode([{"kind": "beat", "io": 1.5, **BASE}]),
        msgspec.msgpack.encode([GOOD, {"kind": "step", **BASE}]),  # one bad event spoils all
        msgspec.msgpack.encode([GOOD] * (protocol.MAX_BATCH_EVENTS + 1)),
        msgspec.msgpack.encode([{**GOOD, "metrics": {f"m{i}": i for i in range(100)}}]),
        b"x" * (protocol.MAX_MESSAGE_BYTES + 1),
    ],
)
def test_invalid_messages_are_rejected(raw):
    with pytest.raises(protocol.InvalidEvent):
        protocol.decode_batch(raw)


def test_pickle_is_never_accepted():
    import pickle

    with pytest.raises(protocol.InvalidEvent):
        protocol.decode_batch(pickle.dumps([GOOD]))


def test_invalid_utf8_in_an_11_byte_message_is_rejected_not_raised():
    # A list holding a map whose string is invalid UTF-8: once an uncaught UnicodeDecodeError.
    raw = b"\x91\x81\xa4kind\xa3\xff\xfe\xfd"
    assert len(raw) == 11
    with pytest.raises(protocol.InvalidEvent):
        protocol.decode_batch(raw)


def test_any_bytes_decode_or_are_rejected():
    rng = random.Random(7)
    valid = protocol.encode_batch([protocol.Step(step=1, loss=0.5, samples=8, **BASE)])
    for _ in range(20_000):
        if rng.random() < 0.5:
            raw = rng.randbytes(rng.randrange(64))
        else:
            data = bytearray(valid)
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            raw = bytes(data)
        try:
            batch = protocol.decode_batch(raw)
        except protocol.InvalidEvent:
            continue
        assert isinstance(batch, list)


NONFINITE = [float("nan"), float("inf"), float("-inf")]


def same(a, b):
    """Equal, counting NaN as equal to NaN."""
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("value", NONFINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(
    ("cls", "field", "extra"),
    [
        (protocol.Step, "loss", {"step": 1}),
        (protocol.Step, "samples_per_s", {"step": 1}),
        (protocol.Step, "step_time", {"step": 1}),
        (protocol.Eval, "accuracy", {}),
        (protocol.Eval, "loss", {}),
        (protocol.EpochEnd, "time", {"epoch": 1, "samples": 3}),
    ],
)
def test_non_finite_floats_round_trip_through_strict_json(cls, field, extra, value):
    event = cls(**BASE, **extra, **{field: value})
    line = protocol.to_json(event)
    data = json.loads(line, parse_constant=lambda name: pytest.fail(f"non-JSON {name}"))
    assert data[field] == {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[repr(value)]
    back = protocol.from_json(line)
    assert type(back) is cls and same(getattr(back, field), value)
    assert protocol.to_json(back) == line


@pytest.mark.parametrize(
    "odd",
    [
        None,
        protocol.Step(step=2, loss=float("nan"), **BASE),
        protocol.Step(step=2, metrics={"gn": float("-inf"), "lr": 0.1}, **BASE),
    ],
    ids=["all-finite", "nan-loss", "inf-metric"],
)
def test_json_lines_are_each_events_line_whatever_it_holds(odd):
    events = [
        protocol.Status(state="started", pid=7, host="h", **BASE),
        protocol.Step(step=1, loss=0.5, samples=8, phases={"data": 0.01}, **BASE),
        protocol.Beat(frame="f (a.py:1)", cpu=1.5, steps=1, **BASE),
        protocol.Eval(epoch=1, accuracy=0.9, **BASE),
    ]
    if odd is not None:
        events.insert(2, odd)
    lines = protocol.to_json_lines(iter(events))
    assert lines == b"".join(protocol.to_json(e) + b"\n" for e in events)
    assert protocol.to_json_lines([]) == b""


def test_non_finite_metrics_round_trip_and_finite_values_are_untouched():
    event = protocol.Step(
        step=1, loss=0.25, metrics={"gn": float("inf"), "lr": 0.1, "n": 3, "tag": "a"}, **BASE
    )
    line = protocol.to_json(event)
    assert json.loads(line)["metrics"] == {"gn": "Infinity", "lr": 0.1, "n": 3, "tag": "a"}
    back = protocol.from_json(line)
    assert back.metrics == {"gn": float("inf"), "lr": 0.1, "n": 3, "tag": "a"}
    assert back.loss == 0.25
    assert protocol.from_json(protocol.to_json(protocol.Step(step=1, **BASE))).loss is None


@pytest.mark.parametrize("line", [b'{"kind":"step","step":1,"loss":"high"}', b"[1]", b"{", b"\xff"])
def test_lines_that_are_not_events_are_rejected(line):
    with pytest.raises(protocol.InvalidEvent):
        protocol.from_json(line)


def test_a_failed_status_carries_a_capped_traceback():
    status = protocol.Status(state="failed", error="E: x", traceback="Traceback...\n", **BASE)
    assert protocol.decode_batch(protocol.encode_batch([status])) == [status]
    too_long = "x" * (protocol.MAX_TRACEBACK_CHARS + 1)
    raw = msgspec.msgpack.encode(
        [{"kind": "status", "state": "failed", "traceback": too_long, **BASE}]
    )
    with pytest.raises(protocol.InvalidEvent):
        protocol.decode_batch(raw)


@pytest.mark.parametrize(
    ("event", "world_size", "why"),
    [
        (protocol.Step(step=1, **BASE), 2, None),
        (protocol.Step(step=1, loss=float("nan"), **BASE), 2, None),  # training may diverge
        (protocol.Step(step=1, **{**BASE, "rank": 2}), 2, "rank 2 outside world size 2"),
        (protocol.Step(step=1, **{**BASE, "rank": 10**9}), 2, "rank 1000000000 outside"),
        (protocol.Step(step=1, **{**BASE, "rank": 10**9}), None, None),
        (protocol.Step(step=1, **{**BASE, "t": float("inf")}), 2, "non-finite time"),
        (protocol.Step(step=1, step_time=-0.1, **BASE), 2, "step_time"),
        (protocol.Step(step=1, step_time=float("nan"), **BASE), 2, "step_time"),
        (protocol.Step(step=1, step_time=float("inf"), **BASE), 2, "step_time"),
        (protocol.Step(step=1, samples_per_s=-1.0, **BASE), 2, "samples_per_s"),
        (protocol.Step(step=1, samples_per_s=float("nan"), **BASE), 2, "samples_per_s"),
        (protocol.Step(step=1, samples_per_s=1e300, **BASE), 2, "samples_per_s"),
        (protocol.Step(step=1, epoch=-1, **BASE), 2, "epoch -1"),
        (protocol.EpochEnd(epoch=1, time=-1.0, samples=1, **BASE), 2, "epoch time"),
        (protocol.EpochEnd(epoch=1, time=float("nan"), samples=1, **BASE), 2, "epoch time"),
        (protocol.Eval(count=-5, **BASE), 2, "count -5"),
        (protocol.Status(state="started", pid=-1, **BASE), 2, "pid -1"),
        (protocol.Status(state="started", world_size=0, **BASE), 2, "world_size 0"),
        (protocol.Status(state="started", local_rank=3, world_size=2, **BASE), 2, "local_rank 3"),
        (protocol.Status(state="started", steps_per_epoch=-1, **BASE), 2, "steps_per_epoch"),
        (protocol.LogLine(stream="stdout", line="hi", **BASE), 2, None),
    ],
)
def test_implausible_events(event, world_size, why):
    reason = protocol.implausible(event, world_size)
    if why is None:
        assert reason is None
    else:
        assert reason is not None and reason.startswith(why)


def test_a_beats_evaluation_count_round_trips_and_an_older_beat_reads_zero():
    beat = protocol.Beat(frame="validate (main.py:383)", steps=3, evaluations=41, **BASE)
    assert protocol.decode_batch(protocol.encode_batch([beat])) == [beat]
    assert protocol.from_json(protocol.to_json(beat)) == beat
    # a run recorded before the field: its beats read 0 evaluation batches
    older = b'{"kind":"beat","v":1,"run":"r1","rank":0,"t":1.0,"seq":0,"steps":3}'
    assert protocol.from_json(older).evaluations == 0
    for bad in (-1, 1.5, "2", True):  # a count, or nothing at all
        raw = msgspec.msgpack.encode([{"kind": "beat", "evaluations": bad, **BASE}])
        with pytest.raises(protocol.InvalidEvent):
            protocol.decode_batch(raw)


def test_a_beats_wakes_round_trip_and_an_older_beat_reads_none():
    beat = protocol.Beat(frame="<module> (w.py:8)", wakes=1234, **BASE)
    assert protocol.decode_batch(protocol.encode_batch([beat])) == [beat]
    assert protocol.from_json(protocol.to_json(beat)) == beat
    older = b'{"kind":"beat","v":1,"run":"r1","rank":0,"t":1.0,"seq":0,"steps":3}'
    assert protocol.from_json(older).wakes is None  # not known: never taken for polling
    for bad in (-1, 1.5, "2", True):
        raw = msgspec.msgpack.encode([{"kind": "beat", "wakes": bad, **BASE}])
        with pytest.raises(protocol.InvalidEvent):
            protocol.decode_batch(raw)
