"""A small subset of the fault matrix (benchmarks/fault_matrix.py) in test time: real ranks
(gloo, CPU, 2 ranks) under ddptui, one fault on one rank; the verdict must name the rank, the
op and its sequence number as the faulty rank wrote them down, with the user's file:line. The
healthy control (a busy preparation of twice the hang timeout) is the real-world tier's
``long_prep`` run (tests/test_realworld.py), which asserts no verdict. One after the other:
on a loaded machine, runs side by side starve each other's CPU. The whole matrix (every
fault, 4 ranks) is the script."""

import importlib.util
import json
import os
import sys

import pytest

from tests.helpers import ROOT, read_events

pytestmark = pytest.mark.slow

_spec = importlib.util.spec_from_file_location(
    "fault_matrix", ROOT / "benchmarks" / "fault_matrix.py"
)
fault_matrix = importlib.util.module_from_spec(_spec)
sys.modules["fault_matrix"] = fault_matrix  # its dataclass looks its module up
_spec.loader.exec_module(fault_matrix)

HANG_TIMEOUT = 5.0


def test_a_rank_that_sleeps_before_a_collective_is_named_with_the_collective(tmp_path):
    row = fault_matrix.run_case("sleep", "torchrun", 2, HANG_TIMEOUT, tmp_path, timeout=90)
    assert row.note == "fault: rank 1 #17", row  # what the faulty rank wrote down
    assert (row.verdict, row.rank, row.op, row.seq) == ("hang", 1, "all_reduce", 17), row
    # a line of the script (the all_reduce rank 0 waits in, or where it was issued from)
    assert row.where and row.where.startswith("fault_ddp.py:"), row
    assert row.latency is not None and row.latency < 60, row
    # Live, before the verdict: rank 0's heartbeats said it waits in #17 (started, not
    # completed) and rank 1's that it had started nothing after #16.
    beats = [e for e in read_events(tmp_path / "sleep-torchrun-2") if e["kind"] == "beat"]
    marks = [(e["rank"], m) for e in beats for m in e["collectives"]]
    assert marks and all(m["backend"] == "gloo" for _, m in marks), marks  # whose numbers
    assert any(r == 0 and m["started"] == 17 and m["completed"] < 17 for r, m in marks), marks
    assert any(r == 0 and m["op"] == "all_reduce" for r, m in marks), marks
    assert any(r == 1 and m["started"] == 16 for r, m in marks), marks
    # (and before its first collective, a group with none started: None)
    assert not any(r == 1 and (m["started"] or 0) > 16 for r, m in marks), marks


def test_an_extra_collective_is_a_desync_named_before_the_hang_timeout(tmp_path):
    row = fault_matrix.run_case("extra", "spawn", 2, 30.0, tmp_path, timeout=90)
    assert row.note == "fault: rank 1 #17", row
    assert (row.verdict, row.rank, row.op, row.seq) == ("desync", 1, "broadcast", 17), row
    # the line of the script when its trace carried one (a cold dump may lack the stack)
    assert row.where is None or row.where.startswith("fault_ddp.py:"), row
    assert row.latency is not None and row.latency < 30, row  # not the hang timeout


# Its rank spins a core for several seconds: on the real-world tier's worker (before the tier
# starts its runs), never beside those runs, whose healthy ranks it would starve into looking
# like stragglers (seen once: long_prep named a compute straggler under .ci/run's load).
@pytest.mark.xdist_group("realworld")
def test_an_endless_loop_gets_the_waiting_note_naming_the_rank_where_it_spins(tmp_path):
    """Rank 1 spins forever before all-reduce #17 (busy, its stack in one place, as a long
    call would be): no verdict, and the note names rank 1, ``spin`` and the stack standing
    still, within the timeout + 5 s; the run, which would never end, is interrupted."""
    row = fault_matrix.run_case("loop", "spawn", 2, HANG_TIMEOUT, tmp_path, timeout=90)
    assert row.note == "fault: rank 1 #17", row
    assert (row.verdict, row.rank, row.op) == ("waiting", 1, "all_reduce"), row
    assert row.where and row.where.startswith("fault_ddp.py:"), row
    assert row.ok, row  # at ``spin``, "its stack in one place", within the timeout + 5 s
    summary = json.loads((tmp_path / "loop-spawn-2" / "summary.json").read_text())
    assert summary["outcome"] == "interrupted"
    assert not [d for d in summary["diagnoses"] if d["cause"] in ("hang", "desync")]


def test_a_desync_gloo_aborts_the_innocent_rank_for_is_blamed_on_the_rank_that_erred(tmp_path):
    """gloo aborts the rank that receives more bytes than its collective expects (rank 0,
    when rank 1 skipped the all_reduce rank 0 is in): its trace, left on the abort, and the
    other rank's, asked for before torchrun's agent ends it, name the desync, and the abort
    is a consequence of it, not the cause. (Another dtype aborts the same way: its analysis
    is checked on recorded traces; the whole matrix runs both under both launchers.)"""
    fault, launcher = "skip", "torchrun"
    row = fault_matrix.run_case(fault, launcher, 2, HANG_TIMEOUT, tmp_path, timeout=90)
    assert row.note == "fault: rank 1 #17", row
    assert (row.verdict, row.rank, row.op, row.seq) == ("desync", 1, "all_reduce", 17), row
    assert row.where and row.where.startswith("fault_ddp.py:"), row
    summary = json.loads((tmp_path / f"{fault}-{launcher}-2" / "summary.json").read_text())
    causes = {(d["rank"], d["cause"]) for d in summary["diagnoses"]}
    assert (0, "consequence") in causes and (0, "crash") not in causes, causes


@pytest.mark.netns
def test_a_hang_on_node_1_is_named_from_the_trace_its_agent_sends(tmp_path):
    """Two nodes over c10d, node 1 in its own network namespace: rank 1 (node 1) sleeps
    before a collective; node 1's agent sends its trace to node 0, which names the hang."""
    if os.geteuid() != 0:
        pytest.skip("netns unavailable: network namespaces need root")
    row = fault_matrix.run_two_nodes("sleep", HANG_TIMEOUT, tmp_path, timeout=120)
    if row.verdict == "-":
        pytest.skip(row.note)  # the namespace could not be made here
    assert row.note == "fault: rank 1 #17", row
    assert (row.verdict, row.rank, row.op, row.seq) == ("hang", 1, "all_reduce", 17), row
    summary = json.loads((tmp_path / "sleep-2nodes-2" / "summary.json").read_text())
    assert summary["flight_recorder"].startswith("Flight Recorder: traces of ranks 0, 1 ")
