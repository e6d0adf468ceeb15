"""What this machine can run: its CUDA devices (asked of torch only when a driver is loaded)
and the CPU cores this process may use."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ddptui.rank.cpus import usable_cpus


@dataclass(frozen=True)
class Machine:
    """What this machine can run: the CUDA devices torch sees (or why it sees none), and the
    CPU cores this process may use (its affinity, not the machine's core count)."""

    cuda_devices: int = 0
    cuda_reason: str = "CUDA is not available"
    cpu_count: int = field(default_factory=usable_cpus)

    @classmethod
    def detect(cls) -> Machine:
        """Ask torch (imported here, not at module import: it takes seconds).

        Without an NVIDIA driver CUDA cannot be available, so torch is not imported at all:
        that keeps ``ddptui --no-ui`` on a CPU machine from paying for one more torch import.
        """
        if not nvidia_driver_present():
            return cls(0, "no NVIDIA driver loaded (/proc/driver/nvidia is missing)")
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - torch is a dependency
            return cls(0, f"torch not importable: {exc}")
        if not torch.cuda.is_available():
            reason = (
                "torch has no CUDA support"
                if torch.version.cuda is None
                else ("no CUDA device visible (driver missing or CUDA_VISIBLE_DEVICES empty)")
            )
            return cls(0, reason)
        return cls(torch.cuda.device_count(), "")


def nvidia_driver_present() -> bool:
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl")
