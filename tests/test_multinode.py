"""Real multi-node runs on one machine: node 0 (``ddptui --no-ui --nnodes 2``) and node 1
started from the ``ddptui join`` line node 0 prints, over torchrun's c10d rendezvous (node 1
in its own network namespace where one can be made); a rank killed on node 1; and real Slurm
allocations."""

from __future__ import annotations

import os
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from ddptui.rank.net import free_port
from tests.helpers import USER_SCRIPT, processes_of_run, read_events, wait_until

pytest_plugins = ["tests.infra"]
pytestmark = pytest.mark.slow

PY = [sys.executable, "-m", "ddptui.cli"]
#: Small enough to be quick, large enough to learn (one node: 0.95 with these options).
SMALL = ["--epochs", "1", "--", "--train-size", "2000", "--test-size", "500"]


class Node:
    """One ddptui process in a session of its own, its output collected by a thread."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def join_line(self, timeout: float = 60) -> str:
        line = wait_until(
            lambda: next((ln for ln in self.lines if ln.startswith("ddptui join ")), None),
            timeout,
        )
        assert line, f"node 0 printed no join line:\n{self.output}"
        return line

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session and group
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)


def join_argv(line: str, *extra: str) -> list[str]:
    words = shlex.split(line)
    assert words[:2] == ["ddptui", "join"] and len(words) == 3
    return [*PY, *words[1:], *extra]


@contextmanager
def two_nodes(
    tmp_path: Path, *options: str, bind: str = "127.0.0.1", node1_prefix=(), via_dir=False
):
    """Node 0 and node 1 (1 rank each); every process of the run is gone afterwards.
    ``via_dir``: node 1 joins with node 0's run directory (``ddptui join RUN_DIR``, the
    short form where it is shared) instead of the token."""
    port = free_port(bind)
    node0 = Node(
        [*PY, "--no-ui", "--nnodes", "2", "--nproc-per-node", "1", "--device", "cpu"]
        + ["--rdzv-endpoint", f"{bind}:{port}", "--run-dir", str(tmp_path / "n0"), *options]
    )
    nodes = [node0]
    try:
        line = node0.join_line()
        argv = join_argv(line, "--run-dir", str(tmp_path / "n1"))
        if via_dir:
            shared = f"or, where this run directory is shared: ddptui join {tmp_path / 'n0'}"
            # printed just after the join line: the reader thread may not have it yet
            assert wait_until(lambda: shared in node0.output, 30), node0.output
            token = tmp_path / "n0" / "join-token"
            assert stat.S_IMODE(token.stat().st_mode) == 0o600  # the run's secret: owner only
            assert token.read_text().strip() == line.split()[-1]
            argv[argv.index(line.split()[-1])] = str(tmp_path / "n0")
        node1 = Node([*node1_prefix, *argv])
        nodes.append(node1)
        yield node0, node1
    finally:
        for node in nodes:
            node.kill()
        run_id = _run_id(tmp_path / "n0")
        if run_id:
            for proc in processes_of_run(run_id):
                proc.kill()


def _run_id(run_dir: Path) -> str | None:
    try:
        events = read_events(run_dir)
    except OSError:
        return None
    return events[0]["run"] if events else None


@pytest.fixture
def node1_network(request):
    """Node 1's network: a namespace of its own across a veth pair where one can be made
    (root), so that telemetry, the rendezvous and gloo cross a real link; else loopback."""
    try:
        return request.getfixturevalue("netns_pair")
    except pytest.skip.Exception as skipped:
        print(f"node 1 on loopback: {skipped}")
        return None


def test_two_nodes_over_c10d_report_every_rank_to_node_0(tmp_path, node1_network):
    """One run serves the loopback case and the namespace case: node 1 in its own network
    namespace where one can be made (the real link), on loopback where not."""
    bind, prefix, pair = "127.0.0.1", (), node1_network
    if pair is not None:
        prefix = pair.exec_argv("env", f"GLOO_SOCKET_IFNAME={pair.ns_if}")
        bind = pair.host_ip
        os.environ["GLOO_SOCKET_IFNAME"] = pair.host_if  # node 0 inherits it
    try:
        with two_nodes(
            tmp_path, "--trainer", "synthetic", *SMALL, bind=bind, node1_prefix=prefix,
            via_dir=True,
        ) as (node0, node1):  # fmt: skip
            assert node0.wait(150) == 0, node0.output + node1.output
            assert node1.wait(30) == 0, node1.output
            events = read_events(tmp_path / "n0")
            run_id = events[0]["run"]
    finally:
        os.environ.pop("GLOO_SOCKET_IFNAME", None)
    started = {e["rank"]: e for e in events if e["kind"] == "status" and e["state"] == "started"}
    assert {r: e["node"] for r, e in started.items()} == {0: 0, 1: 1}
    assert {e["rank"] for e in events if e["kind"] == "step"} == {0, 1}
    evals = [e for e in events if e["kind"] == "eval"]
    assert {e["rank"] for e in evals} == {0, 1}
    assert max(e["accuracy"] for e in evals) >= 0.9
    samples = [e for e in events if e["kind"] == "node"]
    assert samples and {e["node"] for e in samples} == {1}  # node 1's host load, GPUs
    assert samples[0]["mem_total"] > 0 and samples[0]["host"]
    assert "node 1 finished" in node1.output
    assert "node 1 joined (host " in node0.output
    assert not (tmp_path / "n1" / "events.jsonl").exists()  # node 1's events live on node 0
    assert not (tmp_path / "n0" / "join-token").exists()  # the secret is gone with the run
    if pair is not None:  # the join line names the address node 1 reaches node 0 at
        assert "ddptui join" in node0.output and pair.host_ip in node0.output
    assert processes_of_run(run_id) == []


# A rank on node 0 killed instead is checked by hand and in test_multinode_units.py (the verdict);
# one real run keeps the suite within its time.
@pytest.mark.parametrize("victim", [1], ids=["rank-on-node-1"])
def test_a_rank_killed_on_one_node_ends_both_nodes_naming_it(tmp_path, victim):
    script = ["--script", str(USER_SCRIPT), "--", "--steps", "100000", "--sleep", "0.05"]
    with two_nodes(tmp_path, *script) as (node0, node1):
        started = wait_until(
            lambda: [
                e
                for e in (read_events(tmp_path / "n0") if (tmp_path / "n0").exists() else [])
                if e["kind"] == "status" and e["state"] == "started" and e["rank"] == victim
            ],
            90,
        )
        assert started, node0.output + node1.output
        run_id = started[0]["run"]
        wait_until(lambda: any(e["kind"] == "step" for e in read_events(tmp_path / "n0")), 30)
        os.kill(started[0]["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        code0, code1 = node0.wait(30), node1.wait(30)
        took = time.monotonic() - killed_at
        assert code0 == 1 and code1 == 1, node0.output + node1.output
        assert took < 20, f"{took:.1f} s"
        killed = f"rank {victim} was killed by signal SIGKILL"
        host = os.uname().nodename
        if victim == 1:  # node 0 names the rank, its node and host, and the signal
            assert f"FAILED: rank 1 failed: node 1 (host {host}): {killed}" in node0.output
            assert f"FAILED: node 1 (host {host}): {killed}" in node1.output
        else:
            assert f"FAILED: {killed}: node 0 (host " in node0.output, node0.output
            assert "the run ended failed: rank 0 was killed by signal SIGKILL" in node1.output
        assert processes_of_run(run_id) == []


# -- real Slurm -----------------------------------------------------------------------------------
def _slurm_run(cluster, tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    argv = cluster.salloc(*PY, "--no-ui", "--launcher", "slurm", "--device", "cpu", *options)
    return cluster.run(argv, timeout=150)


@pytest.mark.slurm
@pytest.mark.xdist_group("slurm")  # one 2-CPU cluster: its jobs one at a time
def test_slurm_allocation_runs_the_synthetic_trainer(slurm_cluster, tmp_path):
    run_dir = tmp_path / "run"
    proc = _slurm_run(slurm_cluster, tmp_path, "--run-dir", str(run_dir), *SMALL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = read_events(run_dir)
    assert {e["rank"] for e in events if e["kind"] == "step"} == {0, 1}
    assert max(e["accuracy"] for e in events if e["kind"] == "eval") >= 0.9
    assert "slurm: 1 node(s) x 2 rank(s)" in proc.stdout
    assert processes_of_run(events[0]["run"]) == []


@pytest.mark.slurm
@pytest.mark.xdist_group("slurm")  # one 2-CPU cluster: its jobs one at a time
def test_slurm_allocation_runs_a_script(slurm_cluster, tmp_path):
    run_dir = tmp_path / "run"
    proc = _slurm_run(
        slurm_cluster,
        tmp_path,
        "--run-dir",
        str(run_dir),
        "--script",
        str(USER_SCRIPT),
        "--",
        "--steps",
        "10",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = read_events(run_dir)
    assert {e["rank"] for e in events if e["kind"] == "step"} == {0, 1}
    assert processes_of_run(events[0]["run"]) == []


@pytest.mark.slurm
@pytest.mark.xdist_group("slurm")  # one 2-CPU cluster: its jobs one at a time
def test_slurm_layout_that_cannot_work_is_refused(slurm_cluster, tmp_path):
    proc = _slurm_run(slurm_cluster, tmp_path, "--nproc-per-node", "3")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "SLURM_TASKS_PER_NODE=2" in proc.stderr and "--nproc-per-node 3" in proc.stderr
