"""Join ranks to GPUs by UUID, and spot GPU processes that belong to no rank.

Each rank's ``started`` status event carries its pid and its CUDA device's UUID. CUDA and
NVML may number devices differently (``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER``), so
ranks and GPUs are matched by UUID only, never by index.

A GPU process is *foreign* when its pid is neither a rank's pid nor a descendant of one
(descendants come from the snapshot's tracked processes, so sample with the rank pids).
Pids must be in NVML's pid namespace: inside a container without the host's pid namespace,
NVML lists host pids and everything looks foreign.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ddptui.monitor.snapshot import (
    NA,
    GpuProcess,
    GpuSnapshot,
    NotAvailable,
    ProcessSnapshot,
    SystemSnapshot,
)
from ddptui.monitor.units import GiB, format_bytes

__all__ = [
    "RankInfo",
    "GpuProcessView",
    "GpuView",
    "RankUsage",
    "RankGpuView",
    "normalize_uuid",
    "join_ranks",
    "preflight",
    "rank_labels_from_environment",
]


def normalize_uuid(uuid: str | None | NotAvailable) -> str | None:
    """Canonical form for comparing GPU UUIDs, or None for a missing one.

    NVML says ``GPU-8c7a…``; torch may give the bare ``8c7a…``; case may differ. MIG
    UUIDs (``MIG-…``) keep their prefix, so they never match a whole GPU.
    """
    if uuid is None or uuid is NA:
        return None
    text = str(uuid).strip().lower()
    if text.startswith("gpu-"):
        text = text[4:]
    return text or None


@dataclass(frozen=True, slots=True)
class RankInfo:
    """What the monitor needs to know about a rank (from its ``started`` status event)."""

    pid: int | None
    device_uuid: str | None = None

    @classmethod
    def from_status(cls, event: Any) -> RankInfo:
        """From a ``ddptui.protocol.Status`` (or anything with ``pid``/``device_uuid``)."""
        return cls(pid=getattr(event, "pid", None), device_uuid=getattr(event, "device_uuid", None))


@dataclass(frozen=True, slots=True)
class GpuProcessView:
    """A GPU compute process, attributed to a rank or marked foreign."""

    gpu_index: int
    pid: int
    used_memory: int | NotAvailable
    #: The rank whose process tree holds this pid, or None.
    rank: int | None

    @property
    def foreign(self) -> bool:
        """Belongs to no rank of this run: another job holding the GPU."""
        return self.rank is None


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU with the ranks assigned to it and every process on it."""

    gpu: GpuSnapshot
    #: Ranks whose device UUID is this GPU, sorted.
    ranks: tuple[int, ...]
    processes: tuple[GpuProcessView, ...]

    @property
    def foreign(self) -> tuple[GpuProcessView, ...]:
        return tuple(p for p in self.processes if p.foreign)

    def rank_memory(self, rank: int) -> int | NotAvailable:
        """GPU memory on this GPU held by ``rank``'s process tree (NA if unknown)."""
        return _sum_memory(p for p in self.processes if p.rank == rank)


@dataclass(frozen=True, slots=True)
class RankUsage:
    """What one rank uses: its GPU (matched by UUID), GPU memory, and its process tree."""

    rank: int
    pid: int | None
    device_uuid: str | None
    #: The rank's GPU, or None (a CPU rank, or a UUID this machine's NVML does not list).
    gpu: GpuSnapshot | None
    #: GPU memory the rank's process tree holds on its own GPU; NA when NVML lists none of
    #: its processes there (not started yet, or pids not visible).
    gpu_memory: int | NotAvailable
    #: GPU memory the rank's tree holds on *other* GPUs (e.g. a stray context on GPU 0 from
    #: a missing ``torch.cuda.set_device``); 0 when none.
    other_gpu_memory: int | NotAvailable
    #: The rank's process and its descendants, as sampled (empty if not tracked or gone).
    processes: tuple[ProcessSnapshot, ...]

    @property
    def cpu_percent(self) -> float | NotAvailable:
        """Summed CPU percent of the rank's process tree (NA until every part is known)."""
        if not self.processes:
            return NA
        return _sum_or_na(p.cpu_percent for p in self.processes)

    @property
    def rss(self) -> int | NotAvailable:
        """Summed resident memory of the rank's process tree, in bytes."""
        if not self.processes:
            return NA
        return _sum_or_na(p.rss for p in self.processes)

    @property
    def gpu_utilization(self) -> int | NotAvailable:
        return NA if self.gpu is None else self.gpu.utilization_gpu


@dataclass(frozen=True, slots=True)
class RankGpuView:
    """Ranks and GPUs joined for one snapshot (see :func:`join_ranks`)."""

    gpus: tuple[GpuView, ...]
    ranks: tuple[RankUsage, ...]

    def rank(self, rank: int) -> RankUsage | None:
        return next((r for r in self.ranks if r.rank == rank), None)

    def gpu(self, index: int) -> GpuView | None:
        return next((g for g in self.gpus if g.gpu.index == index), None)

    @property
    def foreign(self) -> tuple[GpuProcessView, ...]:
        """Every GPU process of no rank, on every GPU."""
        return tuple(p for g in self.gpus for p in g.foreign)

    @property
    def unmatched_ranks(self) -> tuple[int, ...]:
        """Ranks that report a device UUID no GPU here has."""
        return tuple(r.rank for r in self.ranks if r.device_uuid and r.gpu is None)


def join_ranks(snapshot: SystemSnapshot, ranks: Mapping[int, RankInfo]) -> RankGpuView:
    """Join ``ranks`` (rank -> :class:`RankInfo`) to the snapshot's GPUs. Pure.

    GPU -> ranks by device UUID; GPU process -> rank by pid, where a rank owns its pid and
    every tracked descendant (``snapshot.processes`` with that rank's pid as ``root``).
    """
    pid_to_rank = _pid_owners(snapshot.processes, ranks)
    by_uuid: dict[str, GpuSnapshot] = {}
    for gpu in snapshot.gpus:
        key = normalize_uuid(gpu.uuid)
        if key is not None:
            by_uuid[key] = gpu

    gpu_views = []
    for gpu in snapshot.gpus:
        key = normalize_uuid(gpu.uuid)
        on_gpu = tuple(
            sorted(
                r for r, info in ranks.items() if key and normalize_uuid(info.device_uuid) == key
            )
        )
        procs = () if gpu.processes is NA else gpu.processes
        gpu_views.append(
            GpuView(
                gpu=gpu,
                ranks=on_gpu,
                processes=tuple(_attribute(gpu.index, p, pid_to_rank) for p in procs),
            )
        )

    rank_views = []
    for rank in sorted(ranks):
        info = ranks[rank]
        key = normalize_uuid(info.device_uuid)
        gpu = by_uuid.get(key) if key else None
        own: list[GpuProcessView] = []
        other: list[GpuProcessView] = []
        for view in gpu_views:
            mine = [p for p in view.processes if p.rank == rank]
            (own if gpu is not None and view.gpu.index == gpu.index else other).extend(mine)
        rank_views.append(
            RankUsage(
                rank=rank,
                pid=info.pid,
                device_uuid=info.device_uuid,
                gpu=gpu,
                gpu_memory=_sum_memory(own) if own else NA,
                other_gpu_memory=_sum_memory(other),
                processes=tuple(
                    p for p in snapshot.processes if info.pid is not None and p.root == info.pid
                ),
            )
        )
    return RankGpuView(gpus=tuple(gpu_views), ranks=tuple(rank_views))


def preflight(
    snapshot: SystemSnapshot,
    *,
    ignore_pids: Iterable[int] = (),
    hidden_threshold: int = GiB,
) -> list[str]:
    """Warnings a launcher can print before starting: GPUs another job already holds.

    One line per GPU process not in ``ignore_pids``, e.g.
    ``GPU 0 (NVIDIA H100): pid 1234 holds 10.2 GiB — another job?``, and one per GPU whose
    used memory exceeds what its visible processes hold by more than ``hidden_threshold``
    (processes in another container). No GPU: no warnings (the report says why).
    """
    ignore = set(ignore_pids)
    warnings = []
    for gpu in snapshot.gpus:
        procs = () if gpu.processes is NA else [p for p in gpu.processes if p.pid not in ignore]
        for proc in procs:
            amount = (
                "an unknown amount of memory"
                if proc.used_memory is NA
                else format_bytes(proc.used_memory)
            )
            warnings.append(f"{gpu.label}: pid {proc.pid} holds {amount} — another job?")
        if gpu.processes is NA or gpu.memory_used is NA:
            continue
        visible = sum(p.used_memory for p in gpu.processes if p.used_memory is not NA)
        hidden = gpu.memory_used - visible
        if not procs and hidden > hidden_threshold:
            warnings.append(
                f"{gpu.label}: {format_bytes(hidden)} in use by processes not visible here"
                " — another job?"
            )
    return warnings


def _pid_owners(
    processes: Iterable[ProcessSnapshot], ranks: Mapping[int, RankInfo]
) -> dict[int, int]:
    root_to_rank = {info.pid: rank for rank, info in ranks.items() if info.pid is not None}
    owners = dict(root_to_rank)
    for proc in processes:
        if proc.root in root_to_rank:
            owners.setdefault(proc.pid, root_to_rank[proc.root])
    return owners


def _attribute(index: int, proc: GpuProcess, pid_to_rank: Mapping[int, int]) -> GpuProcessView:
    return GpuProcessView(
        gpu_index=index, pid=proc.pid, used_memory=proc.used_memory, rank=pid_to_rank.get(proc.pid)
    )


def _sum_memory(procs: Iterable[GpuProcessView]) -> int | NotAvailable:
    return _sum_or_na(p.used_memory for p in procs)


def _sum_or_na(values: Iterable[Any]) -> Any:
    total = 0
    for value in values:
        if value is NA:
            return NA
        total += value
    return total


def rank_labels_from_environment(pids: Iterable[int]) -> dict[int, str]:
    """Labels for processes that are DDP ranks of some run, read from their environment.

    A launcher (torchrun, mp.spawn under ddptui) gives each rank ``RANK``; ddptui adds
    ``DDPTUI_RUN_ID``. So a standalone monitor can say "rank 1 · run 2026…" for a GPU
    process without knowing the run. Processes of other users (environment unreadable) and
    non-rank processes get no label.
    """
    import psutil

    labels: dict[int, str] = {}
    for pid in pids:
        try:
            env = psutil.Process(pid).environ()
        except (psutil.Error, OSError):
            continue
        rank = env.get("RANK")
        if rank is None:
            continue
        run = env.get("DDPTUI_RUN_ID")
        labels[pid] = f"rank {rank}" + (f" · run {run}" if run else "")
    return labels
