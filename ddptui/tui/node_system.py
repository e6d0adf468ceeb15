"""Every node's GPUs and host load, for the system panel of a multi-node run. Pure.

The input is "node -> its latest system sample": a monitor :class:`SystemSnapshot` (the
dashboard's own node, from the :class:`SystemFeed`) or the same sample in its JSON form
(:func:`ddptui.monitor.snapshot.to_dict`, as another node would send it), or None when the
node has sent nothing yet. Values that are missing, of the wrong type or not finite are
shown as ``?``, never guessed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ddptui import protocol
from ddptui.formatting import fmt_duration

#: A node with at most this many GPUs gets a line per GPU; more are summarised on one line.
GPUS_LISTED = 2
GiB = 1024**3


@dataclass(frozen=True)
class NodeSystemLine:
    """What the system panel says about one node."""

    node: int | str | None
    host: str
    #: False until the node has sent a sample ("no sample yet").
    sampled: bool
    #: ``cpu 45% of 16  ram 20/64G``
    host_load: str
    #: One line per GPU, or one summary line; empty without a sample.
    gpus: tuple[str, ...]
    #: ``3s ago`` when the sample's time and the current wall time are known.
    age: str | None = None

    @property
    def label(self) -> str:
        if isinstance(self.node, int):
            return f"node {self.node}"
        return "node ?"


def _get(obj: object, name: str) -> object:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _num(value: object) -> float | None:
    """A finite number, else None (NA, None, bool, str, inf, nan)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _pct(value: object) -> str:
    v = _num(value)
    return "?" if v is None else f"{max(0.0, min(v, 100.0)):.0f}%"


def _gib(used: object, total: object) -> str:
    u, t = _num(used), _num(total)
    if u is None or t is None or t <= 0:
        return "?"
    return f"{u / GiB:.0f}/{t / GiB:.0f}G"


def host_load(host: object) -> str:
    cpu = _pct(_get(host, "cpu_percent"))
    cores = _num(_get(host, "cpu_count"))
    cores_text = f" of {cores:.0f}" if cores is not None and cores > 0 else ""
    ram = _gib(_get(host, "memory_used"), _get(host, "memory_total"))
    return f"cpu {cpu}{cores_text}  ram {ram}"


def _devices(sample: object) -> list[object]:
    gpu = _get(sample, "gpu")
    devices = _get(gpu, "devices") if gpu is not None else None
    if isinstance(devices, list | tuple):
        return list(devices)
    return []


def gpu_lines(sample: object) -> tuple[str, ...]:
    """``GPU0 85% 30/80G 61°C`` per GPU; with many GPUs one line: ``8 GPUs util 85%
    (min 70%)  mem 240/640G  max 71°C``; ``no GPU`` when the node reports none."""
    devices = _devices(sample)
    if not devices:
        gpu = _get(sample, "gpu")
        reason = _get(gpu, "reason") if gpu is not None else None
        return (f"no GPU: {reason}" if isinstance(reason, str) and reason else "no GPU",)
    if len(devices) <= GPUS_LISTED:
        lines = []
        for dev in devices:
            index = _num(_get(dev, "index"))
            temp = _num(_get(dev, "temperature"))
            name = f"GPU{index:.0f}" if index is not None else "GPU?"
            line = (
                f"{name} {_pct(_get(dev, 'utilization_gpu'))}"
                f" {_gib(_get(dev, 'memory_used'), _get(dev, 'memory_total'))}"
            )
            lines.append(line + (f" {temp:.0f}°C" if temp is not None else ""))
        return tuple(lines)
    utils = [u for u in (_num(_get(d, "utilization_gpu")) for d in devices) if u is not None]
    used = [_num(_get(d, "memory_used")) for d in devices]
    total = [_num(_get(d, "memory_total")) for d in devices]
    temps = [t for t in (_num(_get(d, "temperature")) for d in devices) if t is not None]
    util = f"util {sum(utils) / len(utils):.0f}% (min {min(utils):.0f}%)" if utils else "util ?"
    mem = (
        _gib(sum(used), sum(total))  # type: ignore[arg-type]
        if None not in used and None not in total
        else "?"
    )
    text = f"{len(devices)} GPUs {util}  mem {mem}"
    if temps:
        text += f"  max {max(temps):.0f}°C"
    return (text,)


def _from_node_event(sample: protocol.NodeSample) -> dict:
    """A ``ddptui join`` agent's NodeSample event in the snapshot's dict form."""
    return {
        "time": sample.t,
        "host": {
            "cpu_percent": sample.cpu_percent,
            "memory_used": sample.mem_used,
            "memory_total": sample.mem_total,
        },
        "gpu": {
            "reason": sample.gpu_reason,
            "devices": [
                {
                    "index": g.index,
                    "utilization_gpu": g.util,
                    "memory_used": g.mem_used,
                    "memory_total": g.mem_total,
                    "temperature": g.temp,
                }
                for g in sample.gpus
            ],
        },
    }


def node_system_lines(
    nodes: Sequence[tuple[int | str | None, str]],
    samples: Mapping[int | str | None, object],
    now: float | None = None,
) -> tuple[NodeSystemLine, ...]:
    """A line block per node, in the order given (``(node, host)`` pairs); ``now`` (wall
    clock, seconds since the epoch) gives each sample's age."""
    out = []
    for node, host in nodes:
        sample = samples.get(node)
        if isinstance(sample, protocol.NodeSample):
            sample = _from_node_event(sample)
        if sample is None:
            out.append(NodeSystemLine(node, host, False, "no sample yet", ()))
            continue
        t = _num(_get(sample, "time"))
        age = None
        if now is not None and t is not None:
            age = f"{fmt_duration(max(0.0, now - t))} ago"
        out.append(
            NodeSystemLine(
                node, host, True, host_load(_get(sample, "host")), gpu_lines(sample), age
            )
        )
    return tuple(out)


def local_node(
    nodes: Sequence[tuple[int | str | None, str]], hostname: str | None
) -> int | str | None:
    """Which of ``nodes`` is the dashboard's own machine: node 0 (the first node hosts the
    dashboard), else the node whose host is ``hostname``, else None (none of them)."""
    for node, _ in nodes:
        if node == 0 and isinstance(node, int) and not isinstance(node, bool):
            return 0
    for node, host in nodes:
        if hostname and host == hostname:
            return node
    return None
