"""Synthetic multi-node runs: ranks on ``node-K`` hosts that report their node rank, as the
multi-node engine's ``started`` Status events will (the ``node`` field)."""

from __future__ import annotations

from ddptui import protocol
from ddptui.run.state import RankFailureInfo, RunState
from ddptui.tui.sources import ReplaySource


class Status(protocol.Status):
    """A Status event with the node rank (named ``Status``: RunState dispatches on the
    event type's name). Stands in for the protocol's own once it has the field."""

    node: int | None = None


def multi_node_state(
    nodes: int,
    per_node: int,
    steps: int = 20,
    slow: tuple[int, ...] = (),
    silent: tuple[int, ...] = (),
    failed: int | None = None,
    with_node: bool = True,
    crashed: int | None = None,
) -> tuple[RunState, float]:
    """``nodes`` x ``per_node`` ranks, ``steps`` steps each, 0.1 s apart; ``slow`` ranks take
    3x the step time, ``silent`` ranks stop after their first 5 steps, ``crashed`` reports
    its own failure after its last step (the run still live), ``failed`` is killed by
    SIGKILL at the end (the run over). Returns the state and the time it is seen at."""
    world = nodes * per_node
    state = RunState("multi", world, epochs=2)
    seq = [0] * world

    def common(rank: int, t: float) -> dict:
        seq[rank] += 1
        return {"run": "multi", "rank": rank, "t": t, "seq": seq[rank] - 1}

    for rank in range(world):
        node = rank // per_node
        extra = {"node": node} if with_node else {}
        cls = Status if with_node else protocol.Status
        state.apply(
            cls(
                state="started",
                pid=1000 + rank,
                host=f"node-{node}",
                local_rank=rank % per_node,
                world_size=world,
                epochs=2,
                steps_per_epoch=steps * 2,
                device="cpu",
                **extra,
                **common(rank, 0.0),
            ),
            now=0.0,
        )
    t = 0.0
    for step in range(1, steps + 1):
        t = step * 0.1
        for rank in range(world):
            if rank in silent and step > 5:
                continue
            step_time = 0.1 * (3 if rank in slow else 1) * (1 + rank / 1000)
            state.apply(
                protocol.Step(
                    step=step,
                    epoch=1,
                    loss=1.0 / step + rank / 100,
                    samples=32,
                    samples_per_s=32 / step_time,
                    step_time=step_time,
                    **common(rank, t),
                ),
                now=t,
            )
    if crashed is not None:
        state.apply(Status(state="failed", error="RuntimeError: boom", **common(crashed, t)), now=t)
    now = t + 0.05
    if silent:  # the silent ranks' last step is 5 s ago or more, the others' is not
        now = max(now, 0.5 + 5.5, t + 0.05)
    if failed is not None:
        state.set_outcome("failed", RankFailureInfo(failed, exit_code=-9, signal="SIGKILL"), now)
    return state, now


def multi_node_source(nodes: int = 2, per_node: int = 2, **kwargs) -> ReplaySource:
    state, now = multi_node_state(nodes, per_node, **kwargs)
    config = {
        "run_id": "multi",
        "launcher": "torchrun",
        "backend": "gloo",
        "trainer": "synthetic",
        "world_size": nodes * per_node,
        "epochs": 2,
        "device": "cpu",
    }
    return ReplaySource(config, state, None, now=now, note="")
