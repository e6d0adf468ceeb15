"""Ranks that train alone: launched as a world of several, each took its training steps with no
process group (opacus's ``examples/cifar10.py`` under torchrun, which passes no
``--local_rank``). The rank's side (the ``alone`` note at its first step, taken back if it
forms a group after all), the run's comparison of the ranks' notes, and one real run."""

from __future__ import annotations

import sys
import types

import msgspec
import pytest
import torch.distributed as dist

from ddptui import protocol
from ddptui.constants import ENDPOINT_ENV, SPAWNED_ENV
from ddptui.rank import spawned, world
from ddptui.rank.reporter import Reporter
from ddptui.run.collector import Collector
from ddptui.run.diagnosis import CAUSES, Diagnoser, alone_diagnosis
from ddptui.run.state import RunState
from tests.helpers import drain, run_test_script


@pytest.fixture
def launched(monkeypatch):
    """A rank the launcher gave a world of ``launched.world`` (a string, as the environment
    has it); the notes it sends are in ``launched.notes``."""

    class Launched:
        world: str | None = "2"
        notes: list = []

    monkeypatch.setattr(world, "launched", None)
    monkeypatch.setattr(world, "alone_said", False)
    monkeypatch.delenv(SPAWNED_ENV, raising=False)
    Launched.notes = []

    def first_step():
        world.launched = Launched.world
        world.first_step(lambda code, **numbers: Launched.notes.append((code, numbers)))

    Launched.first_step = staticmethod(first_step)
    return Launched


def test_a_rank_of_several_that_steps_with_no_process_group_says_it_trains_alone(launched):
    assert not dist.is_initialized()
    launched.first_step()
    assert launched.notes == [("alone", {})]
    assert world.alone_said


@pytest.mark.parametrize("world", [None, "1", "0", "", "x", "٢", "-2", " 2"])
def test_a_world_of_one_or_none_known_says_nothing(launched, world):
    launched.world = world
    launched.first_step()
    assert launched.notes == []


def test_a_rank_with_its_process_group_or_an_rpc_agent_or_spawned_says_nothing(
    launched, monkeypatch
):
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    launched.first_step()
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    rpc = types.ModuleType("torch.distributed.rpc")
    rpc.is_available = lambda: True
    rpc.api = types.SimpleNamespace(_is_current_rpc_agent_set=lambda: True)
    monkeypatch.setitem(sys.modules, "torch.distributed.rpc", rpc)
    launched.first_step()  # a parameter server's optimizer steps, in an RPC world
    monkeypatch.delitem(sys.modules, "torch.distributed.rpc")
    monkeypatch.setenv(SPAWNED_ENV, "1")  # a script's own worker: ranked by its group
    launched.first_step()
    assert launched.notes == []


def _accelerate(monkeypatch, distributed_type, processes):
    """HF accelerate's state module as far as the rank looks at it: its shared state."""
    import enum

    class DistributedType(str, enum.Enum):  # noqa: UP042 - as accelerate declares it
        NO = "NO"
        MULTI_CPU = "MULTI_CPU"

    state = types.ModuleType("accelerate.state")
    shared = {"distributed_type": DistributedType[distributed_type], "num_processes": processes}
    state.PartialState = type("PartialState", (), {"_shared_state": shared})
    monkeypatch.setitem(sys.modules, "accelerate.state", state)


@pytest.mark.parametrize(
    ("distributed_type", "processes", "said"),
    [("NO", 1, True), ("MULTI_CPU", 2, False), ("NO", 2, False), (None, None, False)],
)
def test_a_rank_that_accelerate_runs_as_a_process_of_its_own_says_so(
    launched, monkeypatch, distributed_type, processes, said
):
    """accelerate 1.15 under torchrun on a machine with no GPU forms the world's process
    group, then runs every rank as its own main process (``DistributedType.NO``): no DDP, no
    sharding (lucidrains/denoising-diffusion-pytorch's Trainer). The group is there, so the
    rank is not ``alone``; accelerate's own state says it trains by itself."""
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    if distributed_type is not None:
        _accelerate(monkeypatch, distributed_type, processes)
    else:
        monkeypatch.delitem(sys.modules, "accelerate.state", raising=False)
    launched.first_step()
    assert launched.notes == ([("accelerate_alone", {})] if said else [])
    assert not world.alone_said  # nothing to take back: it has its group


def test_accelerates_lone_process_is_a_diagnosis_that_says_how_to_use_the_cpu():
    state = RunState("r", 2)
    for rank in (0, 1):
        state.apply(protocol.Status(run="r", rank=rank, t=0.0, seq=0, state="started"), now=1.0)
        state.apply(protocol.Note(run="r", rank=rank, t=0.0, seq=1, code="accelerate_alone"),
                    now=2.0)  # fmt: skip
    found = Diagnoser().notes(state)
    assert [(d.rank, d.cause) for d in found] == [(0, "alone")]
    assert found[0].detail.startswith(
        "rank 0: HF accelerate runs it as a process of its own (DistributedType.NO) though it "
        "joined the run's process group"
    )
    assert found[0].detail.endswith(
        "(ACCELERATE_USE_CPU=true, as accelerate launch --cpu sets it, or Accelerator(cpu=True))"
    )


def test_whatever_torch_says_the_rank_runs_on(launched, monkeypatch):
    def broken():
        raise RuntimeError("no")

    monkeypatch.setattr(dist, "is_initialized", broken)
    launched.first_step()

    def refuse(code, **numbers):
        raise OSError("no socket")

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    world.launched = "2"
    world.first_step(refuse)
    assert launched.notes == [] and not world.alone_said


def test_a_rank_that_forms_its_group_after_all_takes_the_note_back_once(launched, monkeypatch):
    sent = []
    monkeypatch.setenv(ENDPOINT_ENV, "ipc:///nonexistent")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(spawned, "_group_seen", False)
    fake = types.SimpleNamespace(note=lambda code, **numbers: sent.append((code, numbers)))
    monkeypatch.setattr("ddptui.rank.reporter.get_reporter", lambda: fake)
    spawned.on_process_group(1, 2)  # said nothing before: nothing to take back
    launched.first_step()
    assert launched.notes == [("alone", {})]
    spawned.on_process_group(1, 2)
    spawned.on_process_group(1, 2)
    assert sent == [("alone", {"group_size": 2})] and not world.alone_said


def test_the_reporter_asks_at_its_first_step_only_and_every_note_field_arrives(monkeypatch):
    """Over a real socket: the ``alone`` note once, at the first of several steps; and a
    note's every field as sent (a ``local_rank_arg`` note's ``read`` of -1, opacus's default,
    was once taken for the reporter's own device read and arrived as None)."""
    monkeypatch.setattr(world, "launched", "2")
    monkeypatch.setattr(world, "alone_said", False)
    monkeypatch.delenv(SPAWNED_ENV, raising=False)
    collector = Collector("run-1")
    rep = Reporter(collector.endpoint, "run-1", rank=1)
    try:
        for _ in range(3):
            rep.log(samples=4, loss=1.0)
        rep.note("local_rank_arg", local_rank=1, read=-1, dashed=True)
        rep.flush()
        got = drain(collector, lambda got: sum(type(e).__name__ == "Note" for e in got) >= 2)
    finally:
        rep.close()
        collector.close()
    notes = [e for e in got if isinstance(e, protocol.Note)]
    assert [n.code for n in notes] == ["alone", "local_rank_arg"]
    assert (notes[1].local_rank, notes[1].read, notes[1].dashed) == (1, -1, True)
    assert sum(isinstance(e, protocol.Step) for e in got) == 3


# -- the run's side ---------------------------------------------------------------------------
def _state(alone, world=2, taken_back=(), reads=None):
    state = RunState("r", world)
    seq = 0
    for rank in range(world):
        state.apply(protocol.Status(run="r", rank=rank, t=0.0, seq=0, state="started"), now=1.0)
    for rank, read in (reads or {}).items():
        seq += 1
        state.apply(protocol.Note(run="r", rank=rank, t=0.0, seq=seq, code="local_rank_arg",
                                  local_rank=rank, read=read, dashed=False), now=2.0)  # fmt: skip
    for rank in alone:
        seq += 1
        state.apply(protocol.Note(run="r", rank=rank, t=0.0, seq=seq, code="alone"), now=2.0)
    for rank in taken_back:
        seq += 1
        note = protocol.Note(run="r", rank=rank, t=0.0, seq=seq, code="alone", group_size=world)
        state.apply(note, now=3.0)
    return state


def test_ranks_that_all_train_alone_are_said_to_once_with_what_to_look_for():
    state = _state({0, 1})
    found = alone_diagnosis(state, 3.0)
    assert found is not None and (found.rank, found.cause) == (0, "alone") and "alone" in CAUSES
    assert found.detail == (
        "ranks 0 and 1 each train alone: neither formed a process group (torch.distributed."
        "init_process_group) before its first step, so this is 2 separate trainings, not one "
        "DDP run; does the script form it only when given a flag, or a variable torchrun does "
        "not set?"
    )
    diagnoser = Diagnoser()
    assert [d.cause for d in diagnoser.notes(state)] == ["alone"]
    assert diagnoser.notes(state) == []  # once
    four = alone_diagnosis(_state(range(4), world=4), 1.0)
    assert four.detail.startswith("all 4 ranks train alone: none formed a process group")
    assert "so this is 4 separate trainings" in four.detail


def test_where_the_local_rank_option_read_its_default_that_is_the_hint():
    found = alone_diagnosis(_state({0, 1}, reads={1: -1, 0: -1}), 3.0)
    assert found.detail.endswith(
        "not one DDP run; rank 0's script has a --local_rank option that no launcher passed it "
        "(python -m torch.distributed.launch did; torchrun does not): it read -1 where the "
        "rank's LOCAL_RANK is 0; add --local-rank-arg (the form's local rank arg: --local_rank)"
    )


@pytest.mark.parametrize(
    ("alone", "world", "taken_back"),
    [({0}, 2, ()), ({0, 1}, 2, {1}), ({0, 1}, 3, ()), ({0}, 1, ()), (set(), 2, ())],
)
def test_no_finding_unless_every_rank_trains_alone(alone, world, taken_back):
    state = _state(alone, world, taken_back)
    assert alone_diagnosis(state, 1.0) is None
    assert Diagnoser().notes(state) == []


@pytest.mark.parametrize("size", [0, -1, protocol.MAX_NOTE_NUMBER + 1, 1.5, "2", True])
def test_a_group_size_out_of_bounds_is_refused(size):
    raw = {"kind": "note", "run": "r", "rank": 0, "t": 0.0, "seq": 0, "code": "alone",
           "group_size": size}  # fmt: skip
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(msgspec.json.encode(raw), type=protocol.AnyEvent)


@pytest.mark.slow
def test_a_script_that_forms_its_group_only_when_given_its_local_rank_is_said_to_train_alone(
    tmp_path,
):
    """The opacus-shaped script under torchrun: it finishes, each rank alone, and the console
    says so and what to add; with ``--local-rank-arg`` its ranks train together, unsaid."""
    proc = run_test_script(tmp_path, "launch_era_alone.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = [line for line in proc.stdout.splitlines() if line.startswith("diagnosis:")]
    assert len(said) == 1, proc.stdout
    assert said[0].startswith("diagnosis: ranks 0 and 1 each train alone: neither formed")
    assert said[0].endswith("it read -1 where the rank's LOCAL_RANK is 0; add --local-rank-arg "
                            "(the form's local rank arg: --local_rank)")  # fmt: skip
