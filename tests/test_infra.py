"""Smoke tests of the test infrastructure itself: real Slurm, network namespaces, and the
suite-wide set-up of ``tests/conftest.py`` (the order of the tests, the workers, the temp
folder)."""

import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest_plugins = ["tests.infra"]  # the slurm_cluster and netns_pair fixtures

PRINT_SLURM_IDS = (
    "import os; print('task', os.environ['SLURM_PROCID'], os.environ['SLURM_NTASKS'],"
    " os.environ['SLURM_JOB_NUM_NODES'])"
)
PRINT_TEMP = "import tempfile; print(tempfile.gettempdir())"


@pytest.mark.slurm
@pytest.mark.xdist_group("slurm")  # one 2-CPU cluster: its jobs one at a time
def test_srun_in_an_allocation_starts_tasks_with_procid_0_and_1(slurm_cluster):
    argv = slurm_cluster.salloc("srun", sys.executable, "-c", PRINT_SLURM_IDS, ntasks=2)
    proc = slurm_cluster.run(argv, timeout=90)
    assert proc.returncode == 0, proc.stderr
    tasks = sorted(line for line in proc.stdout.splitlines() if line.startswith("task "))
    assert tasks == ["task 0 2 1", "task 1 2 1"], proc.stdout + proc.stderr


@pytest.mark.netns
def test_tcp_from_the_namespace_reaches_the_root_side_veth_address(netns_pair):
    with socket.create_server((netns_pair.host_ip, 0)) as server:
        server.settimeout(30)
        port = server.getsockname()[1]
        code = (
            "import socket, sys; "
            f"s = socket.create_connection(({netns_pair.host_ip!r}, {port}), timeout=20); "
            "s.sendall(b'hello from the namespace'); s.close()"
        )
        client = subprocess.Popen(netns_pair.exec_argv(sys.executable, "-c", code))
        try:
            conn, (peer, _) = server.accept()
            with conn:
                conn.settimeout(20)
                data = conn.recv(64)
            assert client.wait(timeout=30) == 0
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
    assert peer == netns_pair.ns_ip
    assert data == b"hello from the namespace"


@pytest.mark.netns
def test_the_namespace_reaches_nothing_but_its_veth_peer(netns_pair):
    # No default route inside: an outside address fails at once, before any packet leaves.
    code = (
        "import errno, socket\n"
        "try:\n"
        "    socket.create_connection(('192.0.2.1', 9), timeout=5)\n"
        "except OSError as e:\n"
        "    print(errno.errorcode.get(e.errno, e))\n"
    )
    proc = netns_pair.run(sys.executable, "-c", code, timeout=30)
    assert proc.stdout.strip() == "ENETUNREACH", proc.stdout + proc.stderr


def test_the_order_xdist_hands_out_takes_slow_files_in_turn_and_spreads_the_waiting_tests():
    from tests.conftest import _files_in_turn, _spread

    def items(path, n):
        return [SimpleNamespace(path=path, name=f"{path}{i}") for i in range(n)]

    slow = items("a", 3) + items("b", 1) + items("c", 2)
    assert [i.name for i in _files_in_turn(slow)] == ["a0", "b0", "c0", "a1", "c1", "a2"]
    waits = items("w", 3)
    spread = [i.name for i in _spread(_files_in_turn(slow), waits)]
    assert spread == ["a0", "b0", "w0", "c0", "a1", "w1", "c1", "a2", "w2"]
    assert [i.name for i in _spread([], waits)] == ["w0", "w1", "w2"]
    assert _spread(slow, []) == slow


def test_auto_starts_one_worker_more_than_the_cores_unless_told(monkeypatch):
    from tests.conftest import pytest_xdist_auto_num_workers

    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    assert pytest_xdist_auto_num_workers(None) == len(os.sched_getaffinity(0)) + 1
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "5")
    assert pytest_xdist_auto_num_workers(None) == 5
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "lots")  # not a count: ignored
    assert pytest_xdist_auto_num_workers(None) == len(os.sched_getaffinity(0)) + 1


def test_a_process_the_suite_starts_gets_the_suites_own_temp_folder(tmp_path):
    """What a killed torchrun agent or ddptui leaves in its temp directory is removed with the
    suite's folder (``tests/conftest.py``); pytest's own folders stay outside it."""
    folder = Path(subprocess.check_output([sys.executable, "-c", PRINT_TEMP], text=True).strip())
    assert folder.name.startswith("ddptui-suite-") and folder.is_dir()
    assert folder not in tmp_path.parents  # tmp_path is not removed with it
