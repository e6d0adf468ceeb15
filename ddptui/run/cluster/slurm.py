"""Slurm: the allocation's layout, the node agents started with ``srun``, and ``--print-sbatch``.

The layout is read in the allocation's shell (salloc or the batch script), never inside an
``srun`` step, where ``SLURM_NTASKS`` and ``SLURM_TASKS_PER_NODE`` are the step's.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence

from ddptui.constants import ENDPOINT_ENV, JOIN_TOKEN_ENV
from ddptui.run.launcher import Launcher
from ddptui.run.options import ConfigError, RunConfig

_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def tasks_per_node(text: str) -> list[int]:
    """Slurm's compressed ``SLURM_TASKS_PER_NODE`` (``2(x3),1``) expanded per node."""
    counts: list[int] = []
    for item in text.strip().split(","):
        match = _TASKS_ITEM.match(item.strip())
        if match is None:
            raise ValueError(item)
        repeat = int(match.group(2) or 1)
        if repeat > 100_000 or len(counts) + repeat > 100_000:
            raise ValueError(item)
        counts += [int(match.group(1))] * repeat
    return counts


def slurm_layout(env: Mapping[str, str], nnodes: int | None, nproc: int | None) -> tuple[int, int]:
    """(nodes, ranks per node) of the allocation ``env`` describes, or a ConfigError naming the
    variables involved. ``nnodes``/``nproc`` are what the user asked for (None: all of it)."""
    if "SLURM_JOB_ID" not in env or "SLURM_JOB_NUM_NODES" not in env:
        raise ConfigError(
            "launcher",
            "--launcher slurm runs inside a Slurm allocation (salloc or sbatch), and "
            "SLURM_JOB_ID / SLURM_JOB_NUM_NODES are not set here",
        )
    if "SLURM_STEP_NUM_TASKS" in env:
        raise ConfigError(
            "launcher",
            "--launcher slurm runs in the allocation's shell, not inside an srun step "
            f"(SLURM_STEP_ID={env.get('SLURM_STEP_ID', '?')} is set: there SLURM_NTASKS is the "
            "step's)",
        )
    raw_nodes = env.get("SLURM_JOB_NUM_NODES", "")
    if not raw_nodes.isdigit() or int(raw_nodes) < 1:
        raise ConfigError("launcher", f"SLURM_JOB_NUM_NODES={raw_nodes[:20]!r} is not a node count")
    nodes = int(raw_nodes)
    raw_tasks = env.get("SLURM_TASKS_PER_NODE", "")
    try:
        per_node = tasks_per_node(raw_tasks)
    except ValueError:
        raise ConfigError(
            "launcher", f"SLURM_TASKS_PER_NODE={raw_tasks[:40]!r} is not Slurm's task layout"
        ) from None
    if len(per_node) != nodes:
        raise ConfigError(
            "launcher",
            f"SLURM_TASKS_PER_NODE={raw_tasks[:40]!r} describes {len(per_node)} node(s), "
            f"SLURM_JOB_NUM_NODES={nodes}",
        )
    if len(set(per_node)) > 1:
        raise ConfigError(
            "launcher",
            f"ranks per node disagree between the allocation's nodes (SLURM_TASKS_PER_NODE="
            f"{raw_tasks[:40]}): torchrun starts the same number on every node; allocate "
            "with --ntasks-per-node",
        )
    tasks = per_node[0]
    if nnodes is not None and nnodes != nodes:
        raise ConfigError(
            "nnodes",
            f"--nnodes {nnodes} disagrees with the allocation's SLURM_JOB_NUM_NODES={nodes}",
        )
    if nproc is not None and nproc > tasks:
        raise ConfigError(
            "nproc_per_node",
            f"--nproc-per-node {nproc} is more ranks than the allocation's tasks per node "
            f"(SLURM_TASKS_PER_NODE={raw_tasks[:40]}, SLURM_NTASKS="
            f"{env.get('SLURM_NTASKS', '?')})",
        )
    return nodes, nproc or tasks


def first_node(env: Mapping[str, str]) -> str:
    """The allocation's first node (where the rendezvous is hosted)."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    if "[" not in nodelist:
        name = nodelist.split(",")[0].strip()
        if name:
            return name
    scontrol = shutil.which("scontrol")
    if scontrol and nodelist:
        try:
            out = subprocess.run(
                [scontrol, "show", "hostnames", nodelist],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            ).stdout.split()
        except (OSError, subprocess.SubprocessError):
            out = []
        if out:
            return out[0]
    raise ConfigError(
        "launcher", f"cannot tell the allocation's first node from SLURM_JOB_NODELIST={nodelist!r}"
    )


def srun_argv(nnodes: int, run_dir: str) -> list[str]:
    """``srun`` starting one ``ddptui join`` agent per node (the token travels in the
    environment, never on a command line)."""
    srun = shutil.which("srun") or "srun"
    return [
        srun,
        f"--ntasks={nnodes}",
        f"--nodes={nnodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--overlap",
        sys.executable,
        "-m",
        "ddptui.cli",
        "join",
        "--slurm",
        "--run-dir",
        run_dir,
    ]


def sbatch_script(argv: Sequence[str], nnodes: int | None, nproc: int | None) -> str:
    """A ready sbatch script that runs ``ddptui --no-ui --launcher slurm`` with ``argv``."""
    lines = ["#!/bin/bash", "#SBATCH --job-name=ddptui"]
    if nnodes:
        lines.append(f"#SBATCH --nodes={nnodes}")
    if nproc:
        lines.append(f"#SBATCH --ntasks-per-node={nproc}")
    lines += [
        "#SBATCH --output=ddptui-%j.out",
        "set -euo pipefail",
        "# ranks per node and nodes come from the allocation; ddptui starts one agent per",
        "# node with srun and watches every rank",
        "exec " + shlex.join([sys.executable, "-m", "ddptui.cli", "--no-ui", *argv]),
        "",
    ]
    return "\n".join(lines)


class SrunLauncher(Launcher):
    """The job under Slurm: ``srun`` starts one ``ddptui join --slurm`` agent per allocated
    node (node slot = ``SLURM_NODEID``), and ddptui watches srun like any launcher. The join
    token reaches the agents through srun's environment, never a command line."""

    def __init__(self, cfg: RunConfig, token: str) -> None:
        super().__init__(
            "torchrun",
            cfg.world_size,
            cfg.run_dir or ".",
            cfg.run_id,
            None,
            module=None if cfg.script else cfg.trainer_module,
            script=cfg.script,
            args=[],
        )
        self.nnodes = cfg.nnodes
        self._token = token

    def command(self) -> list[str]:
        return srun_argv(self.nnodes, str(self.run_dir / "nodes"))

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env.pop(ENDPOINT_ENV, None)
        env[JOIN_TOKEN_ENV] = self._token
        return env
