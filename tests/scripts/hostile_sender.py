"""Sends hostile messages of every shape to a collector until stdin closes (and at least
--min messages are sent); prints how many it sent.

Usage: python hostile_sender.py ENDPOINT RUN_ID WORLD_SIZE [--min N] [--seed S]

Nothing it sends is a plausible event of one of the run's ranks: a process of the same
account could spoof those, and the test needs every event it counts to be the ranks' own.
"""

import argparse
import random
import select
import sys
import time

import msgspec
import zmq

from ddptui import protocol

parser = argparse.ArgumentParser()
parser.add_argument("endpoint")
parser.add_argument("run_id")
parser.add_argument("world_size", type=int)
parser.add_argument("--min", type=int, default=10_000)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
rng = random.Random(args.seed)
pack = msgspec.msgpack.encode
NAN, INF = float("nan"), float("inf")


def step(**fields):
    event = {"kind": "step", "run": args.run_id, "rank": 0, "t": 1.0, "seq": 0, "step": 1}
    event.update(fields)
    return event


#: A batch to mutate: well-formed, but of another run and a rank no run has (a few flipped
#: bytes cannot turn it into an event of this run).
VALID = pack([step(run="z" * len(args.run_id), rank=10**9, loss=1.0, samples=8)])


def mutated() -> bytes:
    data = bytearray(VALID)
    for _ in range(rng.randint(1, 4)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)


def implausible_event() -> dict:
    """A schema-valid event of this run that no rank of it could have sent."""
    return rng.choice(
        [
            step(rank=10**9),
            step(rank=2**63),
            step(rank=args.world_size),
            step(rank=args.world_size + rng.randrange(200_000)),
            step(step_time=NAN),
            step(step_time=-1.0),
            step(step_time=INF),
            step(samples_per_s=NAN),
            step(samples_per_s=-5.0),
            step(samples_per_s=1e300),
            step(t=INF),
            step(t=NAN),
            step(epoch=-3),
            {**step(), "kind": "epoch", "epoch": 1, "time": -1.0, "samples": 0},
            {**step(), "kind": "epoch", "epoch": 1, "time": NAN, "samples": 0},
            {**step(), "kind": "eval", "count": -1},
            {**step(), "kind": "status", "state": "started", "pid": -1},
            {**step(), "kind": "status", "state": "started", "world_size": 0},
            {**step(), "kind": "status", "state": "failed", "rank": 10**6, "error": "spoof"},
        ]
    )


def shapes():
    """One hostile message of each shape, in random order, forever."""
    makers = [
        lambda: b"\x91\x81\xa4kind\xa3\xff\xfe\xfd",  # 11 bytes: invalid UTF-8 in a map key's value
        lambda: b"\x91\x81\xa3\xff\xfe\xfd\x00",  # invalid UTF-8 as a key
        lambda: rng.randbytes(rng.randrange(0, 512)),
        mutated,
        lambda: b"",
        lambda: pack(rng.choice([0, -1, 2**63, "text", 1.5, None, True, {}, {"a": 1}])),
        lambda: pack([rng.choice([0, "x", None, [], 3.5])] * rng.randint(1, 5)),
        lambda: pack([{"kind": rng.choice(["step", "status", "nope", 5]), "run": args.run_id}]),
        lambda: pack([step(step="many")]),
        lambda: pack([step(run=rng.randbytes(8).hex())]),  # foreign run id
        lambda: pack([step(run="x" * 10_000)]),
        lambda: pack([step(metrics={f"m{i}": i for i in range(1_000)})]),
        lambda: pack([step()] * (protocol.MAX_BATCH_EVENTS + 1)),
        lambda: b"\x91" * 50_000 + b"\xc0",  # deeply nested lists
        lambda: pack([implausible_event() for _ in range(rng.randint(1, 50))]),
        lambda: pack(
            [{**step(), "kind": "status", "state": "failed", "rank": 10**9, "error": "e"}]
        ),
        lambda: pack([step(v=2)]),
        lambda: b"\xc1" * 64,  # a never-used msgpack byte
        lambda: b"\xd9\xff" + b"\xff" * 255,  # a str8 of invalid UTF-8
    ]
    while True:
        rng.shuffle(makers)
        yield from (make() for make in makers)


def huge() -> list[bytes]:
    """Messages over the size cap (received, counted as oversized, dropped)."""
    return [
        rng.randbytes(protocol.MAX_MESSAGE_BYTES + 1),
        b"\x00" * (protocol.MAX_MESSAGE_BYTES * 3 // 2),
    ]


def stdin_closed() -> bool:
    ready, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(ready) and sys.stdin.read(1) == ""


sent = 0
with zmq.Context() as ctx, ctx.socket(zmq.PUSH) as push:
    push.setsockopt(zmq.LINGER, 2_000)
    push.connect(args.endpoint)
    for message in huge():
        push.send(message)
        sent += 1
    source = shapes()
    while sent < args.min or not stdin_closed():
        for _ in range(200):
            push.send(next(source))
            sent += 1
        time.sleep(0.05)
print(sent, flush=True)
