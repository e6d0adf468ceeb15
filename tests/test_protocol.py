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
