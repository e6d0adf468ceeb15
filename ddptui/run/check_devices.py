"""Checks of where the ranks compute: the device and backend (``auto`` resolved), AMP fp16
and SyncBatchNorm on CUDA ranks, and how many ranks fit on this machine."""

from __future__ import annotations

from ddptui.constants import MAX_RANKS_PER_CORE
from ddptui.run.machine import Machine
from ddptui.run.options import (
    MAX_LOCAL_RANKS,
    Checks,
    ConfigError,
    clipped_number,
)


def resolve_device(
    checks: Checks, machine: Machine, device: str, backend: str | None
) -> tuple[str, str | None]:
    """(resolved device, resolved backend): auto means cuda when a GPU is visible; backend
    auto means nccl for CUDA ranks, gloo for CPU ranks."""
    gpus = machine.cuda_devices
    if device == "cuda" and gpus == 0:
        checks.fail("device", f"--device cuda needs a CUDA GPU: {machine.cuda_reason}")
    resolved = "cuda" if device == "cuda" or (device == "auto" and gpus > 0) else "cpu"
    if backend == "auto":
        backend = "nccl" if resolved == "cuda" else "gloo"
    elif backend == "nccl" and resolved == "cpu":
        if gpus == 0:
            checks.fail("backend", f"backend nccl needs a CUDA GPU: {machine.cuda_reason}")
        else:
            checks.fail(
                "backend",
                "backend nccl needs CUDA ranks, and --device cpu runs CPU ranks "
                "(use --backend gloo or auto)",
            )
    return resolved, backend


def needs_cuda_ranks(checks: Checks, machine: Machine, resolved: str, field: str) -> None:
    """AMP fp16 and SyncBatchNorm run only on CUDA ranks."""
    if resolved == "cuda":
        return  # (no GPU at all under --device cuda is the device's own error)
    reason = machine.cuda_reason
    if field == "amp":
        checks.fail(
            field,
            f"AMP fp16 needs a CUDA GPU ({reason}); use --amp bf16 on CPU"
            if machine.cuda_devices == 0
            else "AMP fp16 needs CUDA ranks, not --device cpu (use --amp bf16 on CPU)",
        )
    else:
        checks.fail(
            field,
            f"--sync-bn needs a CUDA GPU: torch's SyncBatchNorm runs only on GPUs ({reason})"
            if machine.cuda_devices == 0
            else "--sync-bn needs CUDA ranks, not --device cpu: SyncBatchNorm runs only on GPUs",
        )


def check_world_size(
    checks: Checks,
    machine: Machine,
    device: str,
    world_size: int,
    oversubscribe: bool,
    per_node: bool = False,
) -> None:
    """The one check of how many ranks fit on this machine: one GPU per CUDA rank; without
    CUDA, at most 4 per usable core unless --oversubscribe; never more than 1024.
    ``per_node``: ``world_size`` is a multi-node run's ranks per node (each node is judged
    like this one), and the messages name --nproc-per-node."""
    if per_node:
        errors: list[ConfigError] = []
        check_world_size(Checks(errors), machine, device, world_size, oversubscribe)
        for error in errors:
            checks.fail(
                "nproc_per_node",
                str(error)
                .replace("world size", "--nproc-per-node")
                .replace("--world-size", "--nproc-per-node"),
            )
        return
    gpus, cores = machine.cuda_devices, machine.cpu_count
    if device == "cuda" and gpus > 0 and world_size > gpus:
        checks.fail(
            "world_size",
            f"world size {clipped_number(world_size)} is more than the {gpus} GPU(s) visible "
            f"here: each CUDA rank needs its own GPU (use --world-size {gpus} or less, or "
            "--device cpu for CPU ranks)",
        )
    elif device == "cpu" and world_size > MAX_RANKS_PER_CORE * cores and not oversubscribe:
        checks.fail(
            "world_size",
            f"world size {clipped_number(world_size)} is more than "
            f"{MAX_RANKS_PER_CORE * cores} ranks for the {cores} usable CPU core(s) here "
            f"({MAX_RANKS_PER_CORE} per core): use fewer ranks, or --oversubscribe to start "
            "them anyway",
        )
    elif world_size > MAX_LOCAL_RANKS:
        checks.fail(
            "world_size",
            f"world size {clipped_number(world_size)} is more than the {MAX_LOCAL_RANKS} ranks "
            "ddptui starts on one machine, even with --oversubscribe",
        )
