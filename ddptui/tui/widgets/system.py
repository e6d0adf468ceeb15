"""GPU and host panels drawn from monitor snapshots (never from NVML or psutil directly)."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Static

from ddptui.formatting import counted
from ddptui.monitor import NA, GpuHistory, GpuSnapshot, GpuView, is_na
from ddptui.monitor.units import GiB, format_bytes, format_percent, format_value
from ddptui.tui.node_system import NodeSystemLine
from ddptui.tui.system_feed import SystemFeed
from ddptui.tui.widgets.spark import FixedSparkline
from ddptui.tui.widgets.text import QuietStatic, TextLines, as_text

#: Most samples handed to a sparkline (one column each; a terminal is rarely wider).
SPARK_POINTS = 240
#: The fixed scale of each history: percentages and temperature in degrees C.
PERCENT_SCALE = (0.0, 100.0)
TEMPERATURE_SCALE = (0.0, 100.0)


def bar(percent: float | object, width: int = 20) -> Text:
    """``████████░░░░`` filled to ``percent``; colored by load."""
    if is_na(percent) or percent is None:
        return Text("░" * width, style="dim")
    value = max(0.0, min(100.0, float(percent)))  # type: ignore[arg-type]
    filled = round(value / 100 * width)
    style = "green" if value < 60 else "yellow" if value < 85 else "red"
    return Text.assemble(("█" * filled, style), ("░" * (width - filled), "dim"))


def used_of_total(used: int | object, total: int | object) -> str:
    """``14.4/40 GiB`` (short enough for a narrow panel)."""
    if is_na(used) or is_na(total):
        return f"{format_bytes(used)}/{format_bytes(total)}"
    return f"{used / GiB:.1f}/{total / GiB:.0f} GiB"  # type: ignore[operator]


def short_bytes(value: int | object) -> str:
    """``3.5G``, ``512M``: for one-line summaries."""
    text = format_bytes(value)
    return text.replace(" GiB", "G").replace(" MiB", "M").replace(" KiB", "K")


def _points(series: Iterable[float | None]) -> list[float | None]:
    """The newest samples, one per column; None where a value was not available."""
    return list(series)[-SPARK_POINTS:]


def power_scale(limit: object, series: Iterable[float | None]) -> tuple[float, float]:
    """0 to the power limit; without a known limit, 0 to the highest draw seen (or 1 W)."""
    if not is_na(limit) and limit and float(limit) > 0:  # type: ignore[arg-type]
        return 0.0, float(limit)  # type: ignore[arg-type]
    seen = [v for v in series if v is not None]
    return 0.0, max(seen, default=1.0) or 1.0


def pcie_label(gpu: GpuSnapshot) -> str | None:
    """``pcie rx 1.0M/s tx 2.9M/s 3s ago``, or None where PCIe was not measured."""
    if is_na(gpu.pcie_age):
        return None
    return (
        f"pcie rx {short_bytes(gpu.pcie_rx)}/s tx {short_bytes(gpu.pcie_tx)}/s"
        f" {gpu.pcie_age:.0f}s ago"
    )


def history_legend(interval: float) -> str:
    """How to read the sparklines' time axis: ``1 column = 1 s, newest right``."""
    return f"1 column = {interval:g} s, newest right"


def _ranks_label(ranks: tuple[int, ...]) -> str:
    return "ranks " + ",".join(map(str, ranks)) if ranks else "no rank"


class Metric(Horizontal):
    """``label value  ▁▂▃▅▇`` — one line, or taller with class ``tall``."""

    def __init__(self, label: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self._label = label

    def compose(self) -> ComposeResult:
        yield Static(self._label, classes="metric-label")
        yield QuietStatic(classes="metric-value")
        yield FixedSparkline(classes="metric-spark")

    def show(
        self, value: Text | str, points: list[float | None], scale: tuple[float, float]
    ) -> None:
        """The value, and its history on the fixed ``scale`` (low, high)."""
        self.query_one(".metric-value", QuietStatic).show_text(value)
        self.query_one(FixedSparkline).show(points, *scale)


class GpuCard(Vertical):
    """One GPU: name and ranks, then utilization, memory, temperature, power."""

    def __init__(self, index: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.index = index

    def compose(self) -> ComposeResult:
        yield QuietStatic(classes="gpu-title")
        yield Metric("util", classes="gpu-util")
        yield Metric("mem", classes="gpu-mem")
        yield Metric("temp", classes="gpu-temp")
        yield Metric("power", classes="gpu-power")

    def show(
        self,
        gpu: GpuSnapshot,
        view: GpuView | None,
        history: GpuHistory | None,
        wide: bool = False,
        with_ranks: bool = True,
    ) -> None:
        ranks = view.ranks if view else ()
        name = str(gpu.name).removeprefix("NVIDIA ")
        title = Text.assemble((f"GPU {gpu.index} ", "bold"), (name, "cyan"), "  ")
        if with_ranks:
            title.append(_ranks_label(ranks), "bold magenta" if ranks else "dim")
            if view and view.foreign:
                title.append(f" +{len(view.foreign)} other", "yellow")
        elif view:
            title.append(counted(len(view.processes), "process", "processes"), "dim")
        pcie = pcie_label(gpu)
        if pcie:  # only where it was measured, always with its age
            title.append(f"  {pcie}", "dim")
        self.query_one(".gpu-title", QuietStatic).show_text(title)
        width = 20 if wide else 8
        util = Text.assemble(
            bar(gpu.utilization_gpu, width), f" {format_percent(gpu.utilization_gpu):>4}"
        )
        mem = Text.assemble(
            bar(gpu.memory_percent, width), f" {used_of_total(gpu.memory_used, gpu.memory_total)}"
        )
        power = f"{format_value(gpu.power_draw, ' W', 0)}"
        if not is_na(gpu.power_limit):
            power += f" / {format_value(gpu.power_limit, ' W', 0)}"
        h = history
        self.query_one(".gpu-util", Metric).show(
            util, _points(h.utilization if h else ()), PERCENT_SCALE
        )
        # Memory as a percent of the total: the scale is 0..total.
        self.query_one(".gpu-mem", Metric).show(
            mem, _points(h.memory_percent if h else ()), PERCENT_SCALE
        )
        self.query_one(".gpu-temp", Metric).show(
            format_value(gpu.temperature, "°C"),
            _points(h.temperature if h else ()),
            TEMPERATURE_SCALE,
        )
        draws = _points(h.power_draw if h else ())
        self.query_one(".gpu-power", Metric).show(power, draws, power_scale(gpu.power_limit, draws))


class GpuList(Vertical):
    """A card per GPU, or the reason there is none."""

    def __init__(self, wide: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.wide = wide
        self._indices: tuple[int, ...] = ()

    def compose(self) -> ComposeResult:
        yield QuietStatic("sampling…", classes="gpu-none")

    def show(self, feed: SystemFeed) -> None:
        snap = feed.snapshot
        none = self.query_one(".gpu-none", QuietStatic)
        if snap is None:
            return
        if not snap.gpu.available or not snap.gpus:
            reason = snap.gpu.reason or "NVML lists no device"
            none.show_text(Text(f"No NVIDIA GPU: {reason}", style="yellow"))
            none.display = True
            return
        none.display = False
        indices = tuple(g.index for g in snap.gpus)
        if indices != self._indices:
            self.query(GpuCard).remove()
            self.mount_all([GpuCard(i, classes="gpu-card") for i in indices])
            self._indices = indices
            self.call_after_refresh(self.show, feed)  # draw once the cards exist
            return
        for card, gpu in zip(self.query(GpuCard), snap.gpus, strict=False):
            view = feed.view.gpu(gpu.index) if feed.view else None
            card.show(
                gpu,
                view,
                feed.history.gpus.get(gpu.index),
                wide=self.wide,
                with_ranks=feed.has_ranks,
            )


class HostLine(Vertical):
    """Host CPU and RAM with sparklines."""

    def compose(self) -> ComposeResult:
        yield Metric("CPU", classes="host-cpu")
        yield Metric("RAM", classes="host-ram")

    def show(self, feed: SystemFeed, wide: bool = False) -> None:
        snap = feed.snapshot
        if snap is None:
            return
        host = snap.host
        width = 20 if wide else 8
        cpu = Text.assemble(
            bar(host.cpu_percent, width),
            f" {format_percent(host.cpu_percent):>4} of {host.cpu_count} cores",
        )
        ram = Text.assemble(
            bar(host.memory_percent, width),
            f" {used_of_total(host.memory_used, host.memory_total)}",
        )
        self.query_one(".host-cpu", Metric).show(cpu, _points(feed.host_cpu), PERCENT_SCALE)
        self.query_one(".host-ram", Metric).show(ram, _points(feed.host_ram), PERCENT_SCALE)


class RankProcesses(QuietStatic):
    """Per-rank process CPU and RSS (the rank's whole process tree)."""

    def show(self, feed: SystemFeed) -> None:
        view = feed.view
        if view is None or not view.ranks:
            self.show_text(Text("rank processes: waiting for ranks", style="dim"))
            return
        lines = [Text("rank processes", style="bold")]
        for rank in view.ranks:
            if not rank.processes:
                lines.append(
                    Text(f" r{rank.rank} pid {rank.pid or '--'}  not running", style="dim")
                )
                continue
            line = (
                f" r{rank.rank} pid {rank.pid} cpu {format_percent(rank.cpu_percent):>4}"
                f" rss {short_bytes(rank.rss)}"
            )
            if not is_na(rank.gpu_memory):
                line += f" gpu {short_bytes(rank.gpu_memory)}"
            lines.append(Text(line))
        self.show_text(Text("\n").join(lines))


class NodeLoads(TextLines):
    """Every node's host load and GPUs (multi-node runs); hidden for a single node. Drawn
    line by line: each second every node's sample age changes, and only the lines in view
    are painted."""

    def show(self, nodes: tuple[NodeSystemLine, ...]) -> None:
        if self.display != bool(nodes):
            self.display = bool(nodes)
        if not nodes:
            return
        lines = [Text("nodes", style="bold")]
        for node in nodes:
            head = Text.assemble((node.label, "bold cyan"), f" {node.host}")
            if not node.sampled:
                head.append("  no sample yet", "dim")
                lines.append(head)
                continue
            if node.age:
                head.append(f"  {node.age}", "dim")
            lines.append(head)
            lines.append(Text(f"  {node.host_load}"))
            lines.extend(Text(f"  {gpu}") for gpu in node.gpus)
        lines.append(Text("this machine", style="bold"))
        self.show_lines(lines)


class SystemPanel(VerticalScroll):
    """The run screen's system panel: every node (multi-node runs), then this machine's
    GPUs, host and rank processes."""

    def compose(self) -> ComposeResult:
        yield QuietStatic("system", classes="panel-title")
        yield NodeLoads(id="sys-nodes")
        yield GpuList(id="sys-gpus")
        yield HostLine(id="sys-host")
        yield RankProcesses(id="sys-ranks")

    def show(self, feed: SystemFeed, nodes: tuple[NodeSystemLine, ...] = ()) -> None:
        title = Text.assemble("system  ", (history_legend(feed.interval), "dim not bold"))
        self.query_one(".panel-title", QuietStatic).show_text(title)
        self.query_one(NodeLoads).show(nodes)
        self.query_one(GpuList).show(feed)
        self.query_one(HostLine).show(feed)
        self.query_one(RankProcesses).show(feed)


class ProcessTable(DataTable):
    """GPU processes and rank processes, with the rank each belongs to."""

    COLUMNS = ("GPU", "pid", "rank", "GPU mem", "CPU", "RSS", "name")

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        self.add_columns(*self.COLUMNS)

    def show(self, feed: SystemFeed) -> None:
        snap, view = feed.snapshot, feed.view
        if snap is None:
            return
        rows = []
        seen = set()
        for gpu_view in view.gpus if view else ():
            for proc in gpu_view.processes:
                seen.add(proc.pid)
                rows.append((str(gpu_view.gpu.index), proc.pid, proc.rank, proc.used_memory))
        for rank_view in view.ranks if view else ():
            for proc in rank_view.processes:
                if proc.pid not in seen:
                    seen.add(proc.pid)
                    rows.append(("-", proc.pid, rank_view.rank, NA))
        self.clear()
        for gpu, pid, rank, memory in sorted(rows, key=lambda r: (r[0], r[1])):
            proc = snap.process(pid)
            if rank is not None:
                label = Text(f"rank {rank}", style="magenta")
            elif pid in feed.env_labels:  # a rank of some run, found by its environment
                label = as_text(feed.env_labels[pid], style="cyan")
            else:
                label = Text("other", style="yellow" if gpu != "-" else "dim")
            self.add_row(
                gpu,
                str(pid),
                label,
                format_bytes(memory),
                format_percent(proc.cpu_percent) if proc else "N/A",
                format_bytes(proc.rss) if proc else "N/A",
                as_text(proc.name) if proc else "N/A",  # a process may name itself anything
            )
