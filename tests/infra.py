"""Test infrastructure beyond one process tree: a real Slurm cluster and network namespaces.

A test module declares ``pytest_plugins = ["tests.infra"]`` to get the fixtures (importing
them instead trips ruff's F811, and importing this module before pytest registers it costs its
assertion rewriting) and marks its tests ``slurm`` / ``netns``. Both fixtures skip, with the
reason, where the machine cannot provide the infrastructure, and clean up what a test started
even when it fails.

- ``slurm_cluster``: the single-host Slurm of ``scripts/ci/setup-slurm.sh`` (CI runs that script
  before pytest). The fixture only checks that it is up; with ``DDPTUI_SETUP_SLURM=1`` it runs
  the setup script itself. Every job a test starts must carry ``cluster.job_name`` (the
  ``salloc`` helper adds it), so teardown can ``scancel`` exactly the test's jobs.
- ``netns_pair``: a fresh network namespace joined to the root namespace by a veth pair on a
  private /30 (``scripts/ci/netns.sh``); the root side listens on ``host_ip``, processes started
  with ``exec_argv`` run inside and reach it from ``ns_ip``.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts" / "ci"
SETUP_SLURM = SCRIPTS / "setup-slurm.sh"
SLURM_STATUS = SCRIPTS / "slurm-env.sh"
NETNS = SCRIPTS / "netns.sh"
SETUP_SLURM_ENV = "DDPTUI_SETUP_SLURM"
# How long salloc/srun may wait for the node before giving up (other tests may hold its CPUs).
SLURM_QUEUE_WAIT_S = 60


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (one this test made with start_new_session).

    A process group is not enough: salloc runs its command in a process group of its own.
    """
    for _ in range(50):
        members = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.getsid(int(entry)) == sid:
                        members.append(int(entry))
                except OSError:
                    continue
        if not members:
            return
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
        time.sleep(0.05)


def run_bounded(
    argv: Sequence[str], timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a session of its own; on timeout kill the whole session, then raise."""
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.returncode is None:
            kill_session(proc.pid)
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@functools.cache
def slurm_status() -> tuple[bool, str]:
    """(usable, one-line status) of the test Slurm, checked once per session."""
    if shutil.which("bash") is None:
        return False, "slurm unavailable: no bash"
    script = SETUP_SLURM if os.environ.get(SETUP_SLURM_ENV) == "1" else SLURM_STATUS
    try:
        proc = subprocess.run(
            ["bash", str(script)], capture_output=True, text=True, timeout=240, check=False
        )
    except subprocess.TimeoutExpired:
        return False, f"slurm unavailable: {script.name} did not finish in 240 s"
    line = _last_line(proc.stdout) or _last_line(proc.stderr) or f"exit {proc.returncode}"
    return proc.returncode == 0, line


@dataclass(frozen=True)
class SlurmCluster:
    """The one-node test cluster, as seen by one test."""

    node: str
    cpus: int
    job_name: str

    def env(self) -> dict[str, str]:
        """This process's environment without SLURM_* (an outer allocation must not leak in)."""
        return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}

    def salloc(self, *command: str, nodes: int = 1, ntasks: int = 2) -> list[str]:
        """argv that runs ``command`` on this host inside a new allocation of the test's name."""
        return [
            "salloc",
            f"--nodes={nodes}",
            f"--ntasks={ntasks}",
            f"--job-name={self.job_name}",
            f"--immediate={SLURM_QUEUE_WAIT_S}",
            *command,
        ]

    def run(self, argv: Sequence[str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
        """Run a salloc/srun/sbatch command line bounded in time, without outer SLURM_* vars."""
        return run_bounded(argv, timeout, env=self.env())

    def jobs(self) -> list[str]:
        """Ids of this test's jobs still known to slurmctld."""
        proc = subprocess.run(
            ["squeue", "--noheader", f"--name={self.job_name}", "--format=%i"],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
        return proc.stdout.split()

    def cancel(self, wait_s: float = 20) -> None:
        """scancel every job of this test and wait (bounded) until slurmctld forgets them."""
        subprocess.run(
            ["scancel", f"--name={self.job_name}"], capture_output=True, timeout=15, check=False
        )
        deadline = time.monotonic() + wait_s
        while self.jobs() and time.monotonic() < deadline:
            time.sleep(0.2)


@pytest.fixture
def slurm_cluster() -> Iterator[SlurmCluster]:
    usable, line = slurm_status()
    if not usable:
        pytest.skip(line)
    # "slurm up: NODE CPUS STATE" (scripts/ci/slurm-env.sh)
    _, _, node, cpus, _ = line.split()
    cluster = SlurmCluster(
        node=node, cpus=int(cpus), job_name=f"ddptui-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    )
    try:
        yield cluster
    finally:
        cluster.cancel()


@dataclass(frozen=True)
class NetnsPair:
    """A namespace ``name`` whose veth end ``ns_ip`` reaches ``host_ip`` in the root namespace."""

    name: str
    host_ip: str
    ns_ip: str
    host_if: str
    ns_if: str

    def exec_argv(self, *argv: str) -> list[str]:
        """argv that runs ``argv`` inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the namespace, bounded in time (its whole session killed after)."""
        return run_bounded(self.exec_argv(*argv), timeout)


@pytest.fixture
def netns_pair() -> Iterator[NetnsPair]:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("netns unavailable: network namespaces need root")
    if shutil.which("ip") is None or shutil.which("bash") is None:
        pytest.skip("netns unavailable: iproute2 ('ip') or bash is not installed")
    name = f"ddptui-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DDPTUI_NETNS_OWNER": str(os.getpid())}
    try:
        proc = subprocess.run(
            ["bash", str(NETNS), "up", name],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
            check=False,
        )
        if proc.returncode != 0:
            pytest.skip(_last_line(proc.stdout) or _last_line(proc.stderr) or "netns.sh up failed")
        values = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
        yield NetnsPair(
            name=values["NETNS"],
            host_ip=values["NETNS_HOST_IP"],
            ns_ip=values["NETNS_NS_IP"],
            host_if=values["NETNS_HOST_IF"],
            ns_if=values["NETNS_NS_IF"],
        )
    finally:
        subprocess.run(
            ["bash", str(NETNS), "down", name], capture_output=True, timeout=30, check=False
        )
