"""How many CPU cores this process may use, and how they are shared between ranks.

Respects CPU affinity (``taskset``, cgroup cpusets, Slurm's ``--cpus-per-task``), not just
the machine's core count. One home for the threads-per-rank rule: the launchers, the
trainers and the run-option checks all ask here.
"""

from __future__ import annotations

import os

from ddptui.constants import THREADS_ENV


def usable_cpus() -> int:
    """Cores this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def threads_per_rank(local_world_size: int, environ: dict[str, str] | None = None) -> int:
    """CPU threads for each of ``local_world_size`` ranks on this machine.

    ``DDPTUI_THREADS`` wins when it holds a positive whole number (ddptui's launchers set it);
    otherwise the usable cores are split evenly, at least one thread per rank.
    """
    env = os.environ if environ is None else environ
    explicit = (env.get(THREADS_ENV) or "").strip()
    if explicit.isdigit() and int(explicit) > 0:
        return min(int(explicit), 4096)
    return max(1, usable_cpus() // max(1, local_world_size))


def threads_for_workers(workers: int, environ: dict[str, str] | None = None) -> int:
    """CPU threads for each of ``workers`` processes that a rank spawns itself (a script's
    ``mp.spawn``, which then only waits): the rank's own share (:func:`threads_per_rank` of
    one, ``DDPTUI_THREADS`` as the rank entry set it) split among them, at least one each."""
    return max(1, threads_per_rank(1, environ) // max(1, workers))
