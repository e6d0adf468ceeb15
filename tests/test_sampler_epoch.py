"""A shuffling DistributedSampler never told its epoch: the rank's hook notices it (once), the
wire carries a code and numbers only, and the run says it as one diagnosis (console line,
summary.json, dashboard, replay) without changing any verdict. Unit tier: no processes."""

import gc
import io
import json

import msgspec
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data.distributed import DistributedSampler

from ddptui import protocol, safeio
from ddptui.headless import HeadlessConsole, diagnosis_line
from ddptui.rank import instrument, reporter
from ddptui.run.config import build_config
from ddptui.run.diagnosis import CAUSES, Diagnoser, diagnoses_for_summary
from ddptui.run.launcher import LaunchResult
from ddptui.run.session import RunSession
from ddptui.run.state import RunState
from ddptui.runfiles import write_json_atomic
from ddptui.runs.replay import print_replay

DETAIL = (
    "rank 0: DistributedSampler started a second pass at epoch 0 without set_epoch(): every "
    "epoch shuffles in the same order; call sampler.set_epoch(epoch) before each epoch"
)


class NoteReporter:
    """Records the notes the instrumentation sends through ``Reporter.note``."""

    def __init__(self):
        self.sent = []

    def note(self, code, **numbers):
        self.sent.append((protocol.Note, {"code": code, **numbers}))

    def notes(self):
        return [fields for cls, fields in self.sent if cls is protocol.Note]

    # the steps the training passes below make are delivered here, and dropped
    def before_send(self, callback):
        pass

    def log_step_at(self, *args, **kwargs):
        pass

    def flush(self):
        pass


@pytest.fixture
def inst(monkeypatch):
    fake = NoteReporter()
    monkeypatch.setattr(reporter, "get_reporter", lambda: fake)
    instrument.uninstall()
    installed = instrument.install(force=True)
    installed.fake = fake
    yield installed
    instrument.uninstall()


def sampler(shuffle=True, cls=DistributedSampler, size=10):
    return cls(list(range(size)), num_replicas=2, rank=0, shuffle=shuffle)


_WEIGHTS = torch.nn.Linear(1, 1)
_OPTIMIZER = torch.optim.SGD(_WEIGHTS.parameters(), lr=0.1)  # no gradients: no change


def trained(s, n=1):
    """``n`` passes over ``s``, each feeding a training step (an optimizer step while its pass
    is the one started last); returns the last pass's order."""
    for _ in range(n):
        order = list(s)
        _OPTIMIZER.step()
    return order


# -- the rank side ---------------------------------------------------------------------------
def test_a_sampler_passed_twice_without_set_epoch_is_noted_once(inst):
    first, second = sampler(), sampler()
    orders = [trained(first) for _ in range(3)]
    assert orders[0] == orders[1] == orders[2]  # the bug itself: the same order every pass
    trained(second, 2)  # another one, later: still one note per process
    assert inst.fake.notes() == [{"code": "sampler_epoch", "epoch": 0, "passes": 2}]
    assert not inst.disabled


def test_set_epoch_between_passes_is_no_note(inst):
    s = sampler()
    for epoch in range(3):
        s.set_epoch(epoch)
        trained(s)
    peeked = sampler()  # set_epoch, then a peek at the first batch, then the epoch
    for epoch in range(2):
        peeked.set_epoch(epoch)
        next(iter(peeked)), trained(peeked)
    assert inst.fake.notes() == []


def test_a_peek_then_the_epoch_is_noted_at_the_next_epoch_not_in_the_first(inst):
    # pytorch/examples' multigpu_torchrun.py: next(iter(loader)) for the batch size, then the
    # epoch's loop, and never set_epoch. One epoch shuffles once: nothing wrong yet.
    s = sampler()
    next(iter(s)), trained(s)
    assert inst.fake.notes() == []
    next(iter(s))  # the second epoch's peek: the order of the first again
    assert inst.fake.notes() == [{"code": "sampler_epoch", "epoch": 0, "passes": 3}]


def test_an_evaluation_sampler_iterated_with_grad_enabled_is_no_note(inst):
    # pytorch/examples' minGPT-ddp trainer: the test loader's DistributedSampler shuffles (the
    # default) and is never given set_epoch; its loop runs with grad enabled and only each
    # batch's forward is under set_grad_enabled(False). Its order does not matter: no note.
    train, test = sampler(), sampler()
    for epoch in range(1, 4):
        train.set_epoch(epoch)
        trained(train)
        for _ in test:
            with torch.set_grad_enabled(False):
                _WEIGHTS(torch.ones(1))
    assert inst.fake.notes() == []
    assert not inst.disabled


def test_a_sampler_that_fed_no_training_step_is_no_note(inst):
    # passes that feed no optimizer step (a script's own evaluation, a peek): never judged
    s = sampler()
    list(s), list(s), list(s)
    assert inst.fake.notes() == []


def test_a_sampler_that_does_not_shuffle_is_no_note(inst):
    s = sampler(shuffle=False)
    list(s), list(s), list(s)
    assert inst.fake.notes() == []


def test_an_evaluation_pass_without_grad_is_no_note(inst):
    s = sampler()  # shuffle=True is the default: many test samplers have it
    for _ in range(3):
        with torch.no_grad():
            list(s)
    with torch.inference_mode():
        list(s)
    assert inst.fake.notes() == []


def test_a_subclass_keeps_working_and_is_judged_too(inst):
    class Shifted(DistributedSampler):
        def __iter__(self):
            return (i + 100 for i in super().__iter__())

    plain, sub = sampler(), sampler(cls=Shifted)
    assert trained(sub) == [i + 100 for i in plain]
    trained(sub)
    assert [n["passes"] for n in inst.fake.notes()] == [2]


def test_the_hook_never_raises_into_the_script(inst, monkeypatch):
    class Flaky(DistributedSampler):
        reads = 0

        @property
        def shuffle(self):
            Flaky.reads += 1
            if Flaky.reads == 1:  # the hook reads first: its failure is swallowed
                raise RuntimeError("flaky attribute")
            return self._shuffle

        @shuffle.setter
        def shuffle(self, value):
            self._shuffle = value

    flaky = sampler(cls=Flaky)
    assert sorted(trained(flaky)) == sorted(list(sampler()))
    assert not inst.disabled  # the script's object misbehaved, not the hooks

    def broken():
        raise OSError("no reporter")

    s = sampler()
    first = trained(s)
    monkeypatch.setattr(reporter, "get_reporter", broken)
    assert list(s) == first  # the second pass reports, and the report fails inside
    assert inst.disabled  # an internal error: the hooks stop, the script goes on
    assert len(list(s)) == 5


def test_samplers_are_not_kept_alive_and_the_patch_is_undone(inst):
    s = sampler()
    list(s)
    assert len(inst._samplers) == 1
    del s
    gc.collect()
    assert inst._samplers == {}
    instrument.uninstall()
    assert not hasattr(DistributedSampler.__iter__, "__wrapped__")
    assert not hasattr(DistributedSampler.set_epoch, "__wrapped__")


# -- the wire --------------------------------------------------------------------------------
def note(rank=0, seq=0, t=5.0, **fields):
    fields = {"code": "sampler_epoch", "epoch": 0, "passes": 2, **fields}
    return protocol.Note(run="r", rank=rank, t=t, seq=seq, **fields)


def test_a_note_travels_on_the_wire_and_in_events_jsonl():
    event = note(epoch=7, passes=3)
    assert protocol.decode_batch(protocol.encode_batch([event])) == [event]
    assert protocol.from_json(protocol.to_json(event)) == event
    assert protocol.to_json_lines([event]) == protocol.to_json(event) + b"\n"
    assert protocol.implausible(event, world_size=2) is None
    assert protocol.implausible(note(rank=2), world_size=2) == "rank 2 outside world size 2"
    assert "note" in protocol.KINDS


def _raw(**fields):
    doc = {"kind": "note", "run": "r", "rank": 0, "t": 1.0, "seq": 0, "code": "sampler_epoch"}
    doc.update(fields)
    return doc


@pytest.mark.parametrize(
    "fields",
    [
        {"code": "anything you like"},
        {"code": None},
        {"epoch": -1},
        {"epoch": protocol.MAX_NOTE_NUMBER + 1},
        {"passes": 1},
        {"passes": protocol.MAX_NOTE_NUMBER + 1},
        {"passes": "2"},
    ],
)
def test_a_forged_note_is_rejected_whole(fields):
    step = {"kind": "step", "run": "r", "rank": 0, "t": 1.0, "seq": 1, "step": 1}
    with pytest.raises(protocol.InvalidEvent):
        protocol.decode_batch(msgspec.msgpack.encode([_raw(**fields), step]))
    with pytest.raises(protocol.InvalidEvent):
        protocol.from_json(json.dumps(_raw(**fields)))


def test_a_note_carries_no_text_of_the_sender():
    (event,) = protocol.decode_batch(msgspec.msgpack.encode([_raw(detail="rm -rf ~")]))
    assert not hasattr(event, "detail")
    assert "rm -rf" not in Diagnoser().notes(applied(event))[0].detail


WIRE_INTS = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what msgpack can carry


@given(epoch=WIRE_INTS | st.none(), passes=WIRE_INTS | st.none())
def test_note_numbers_are_accepted_only_in_range(epoch, passes):
    doc = _raw(epoch=epoch, passes=passes)
    top = protocol.MAX_NOTE_NUMBER
    ok = (epoch is None or 0 <= epoch <= top) and (passes is None or 2 <= passes <= top)
    for decode, data in (
        (protocol.decode_batch, msgspec.msgpack.encode([doc])),
        (lambda line: [protocol.from_json(line)], json.dumps(doc)),
    ):
        if ok:
            (event,) = decode(data)
            assert (event.epoch, event.passes) == (epoch, passes)
        else:
            with pytest.raises(protocol.InvalidEvent):
                decode(data)


# -- the run side ----------------------------------------------------------------------------
def applied(*events, world=2):
    state = RunState("r", world)
    for event in events:
        state.apply(event, now=event.t)
    return state


def test_the_state_keeps_the_first_note_and_who_sent_it():
    state = applied(note(rank=1, t=3.0), note(rank=0, t=4.0, epoch=5), note(rank=7, t=5.0))
    seen = state.notes["sampler_epoch"]
    assert (seen.rank, seen.epoch, seen.passes, seen.t) == (1, 0, 2, 3.0)  # the first one
    assert state.events_ignored == 1  # rank 7 is not in this run
    assert {v.state for v in state.ranks.values()} == {"pending"}  # a note is no status
    assert state.outcome is None


def test_one_diagnosis_per_run_with_the_words_to_act_on():
    state = applied(protocol.Status(run="r", rank=0, t=1.0, seq=0, state="started"), note(t=4.0))
    d = Diagnoser(hang_timeout=0)
    (found,) = d.check(state, 4.5)
    assert (found.rank, found.cause, found.detail, found.t) == (0, "sampler", DETAIL, 3.0)
    assert "sampler" in CAUSES
    state.apply(note(rank=1, seq=1, t=4.2))
    assert d.check(state, 5.0) == [] and d.final(state, 6.0) == []
    assert d.diagnoses == [found] and d.hang is None
    assert diagnoses_for_summary(d.diagnoses)["diagnoses"] == [
        {"rank": 0, "cause": "sampler", "detail": DETAIL, "t": 3.0}
    ]
    assert diagnosis_line(found) == "diagnosis: " + DETAIL


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"passes": 3, "epoch": 4}, "started a third pass at epoch 4 without"),
        ({"passes": 12}, "started pass 12 at epoch 0 without"),
        ({"passes": None, "epoch": None}, "started another pass without"),
    ],
)
def test_the_sentence_follows_the_numbers(fields, words):
    (found,) = Diagnoser().notes(applied(note(**fields)))
    assert words in found.detail


def test_a_note_arriving_as_the_run_ends_is_said_at_the_end():
    state = applied(note())
    state.set_outcome("finished")
    d = Diagnoser()
    assert [f.cause for f in d.check(state, 9.0)] == ["sampler"]  # after the end too
    state2 = applied(note())
    assert [f.cause for f in Diagnoser().final(state2, 9.0)] == ["sampler"]


def test_a_session_says_it_once_in_the_console_and_summary_and_replay(tmp_path):
    clock = [100.0]
    cfg = build_config(
        {"device": "cpu", "world_size": "2", "run_dir": str(tmp_path / "run")}, deep=False
    )
    session = RunSession(cfg, clock=lambda: clock[0])
    session.run_dir.mkdir(parents=True)
    write_json_atomic(session.files.config, cfg.to_json_dict())
    session._events_file = safeio.LineAppender(session.events_path)
    session.state.started_at = 98.0
    session._record(
        [protocol.Status(run=cfg.run_id, rank=r, t=1.0, seq=0, state="started") for r in (0, 1)]
        + [
            protocol.Note(
                run=cfg.run_id, rank=r, t=2.0, seq=1, code="sampler_epoch", epoch=0, passes=2
            )
            for r in (0, 1)
        ]
    )
    session._conclude(LaunchResult(0), drain=False)
    out = io.StringIO()
    console = HeadlessConsole(out, tty=False)
    for diagnosis in session.take_diagnoses():
        console.line(diagnosis_line(diagnosis))
    assert out.getvalue() == f"diagnosis: {DETAIL}\n"
    assert session.take_diagnoses() == []
    assert (session.outcome, session.exit_code) == ("finished", 0)
    session._write_summary()
    session.close()
    summary = json.loads(session.files.summary.read_text())
    assert summary["outcome"] == "finished" and summary["exit_code"] == 0
    assert summary["diagnoses"] == [{"rank": 0, "cause": "sampler", "detail": DETAIL, "t": 2.0}]
    kinds = [json.loads(line)["kind"] for line in session.events_path.read_text().splitlines()]
    assert kinds.count("note") == 2
    replay = io.StringIO()
    print_replay(session.run_dir, replay)
    assert replay.getvalue().count(f"diagnosis: {DETAIL}") == 1


def test_the_dashboard_shows_it_with_the_other_diagnoses(tmp_path):
    from ddptui.tui.sources import ReplaySource
    from ddptui.tui.widgets.phases import diagnosis_text

    state = applied(note())
    d = Diagnoser()
    d.check(state, 1.0)
    live = [x.detail for x in d.diagnoses]  # what LiveSource.diagnoses() gives the panel
    assert diagnosis_text(live).plain == f"◆ {DETAIL}"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_json_atomic(run_dir / "config.json", {"run_id": "r", "world_size": 2})
    (run_dir / "events.jsonl").write_bytes(protocol.to_json_lines([note()]))
    write_json_atomic(
        run_dir / "summary.json",
        {"outcome": "finished", "exit_code": 0, **diagnoses_for_summary(d.diagnoses)},
    )
    source = ReplaySource.load(run_dir)
    assert source.diagnoses() == [DETAIL]
    assert source.state.notes["sampler_epoch"].rank == 0


def test_the_reporter_sends_a_note_after_the_ranks_start():
    """``Reporter.note`` over a real socket: the rank's start first, then the note."""
    from ddptui.rank.reporter import Reporter
    from ddptui.run.collector import Collector
    from tests.helpers import drain

    collector = Collector("run-1")
    rep = Reporter(collector.endpoint, "run-1", rank=1)
    try:
        rep.note("sampler_epoch", epoch=3, passes=2)
        rep.flush()
        got = drain(collector, lambda got: len(got) >= 2)
    finally:
        rep.close()
        collector.close()
    assert [type(e).__name__ for e in got] == ["Status", "Note"]
    note = got[1]
    assert (note.rank, note.code, note.epoch, note.passes) == (1, "sampler_epoch", 3, 2)
