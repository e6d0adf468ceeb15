"""The launch screen: every run option in a form, checked as you type with the CLI's own
rules (:func:`ddptui.run.config.check_options`), the machine it will run on, and recent runs.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Checkbox, DataTable, Footer, Input, Label, Select, Static

from ddptui.constants import (
    AMP_MODES,
    BACKEND_CHOICES,
    DEFAULT_CPU_WORLD_SIZE,
    DEVICE_CHOICES,
    LAUNCHERS,
)
from ddptui.formatting import printable
from ddptui.monitor.units import format_bytes
from ddptui.run.config import build_config
from ddptui.run.config import check_options as check_run_options
from ddptui.run.options import (
    TRAINER_OPTIONS,
    ConfigError,
    RunConfig,
    default_workers,
    module_in_script_field,
)
from ddptui.run.registry import DEFAULT_TRAINER, trainer_names
from ddptui.tui.machine import HostInfo, RecentRun, recent_runs
from ddptui.tui.widgets.text import as_text

#: The trainer choice that means "my own script".
OWN_SCRIPT = "__script__"
#: Form fields that are text inputs: raw option name -> (label, placeholder).
TEXT_FIELDS = {
    "script": ("script", "path/to/train.py, or -m package.train"),
    "script_args": ("arguments", "extra arguments, e.g. --steps 10"),
    "local_rank_arg": ("local rank arg", "none: LOCAL_RANK only (or e.g. --local_rank)"),
    "world_size": ("world size", str(DEFAULT_CPU_WORLD_SIZE)),
    "workers": ("data workers", "auto"),
    "epochs": ("epochs", "trainer's default"),
    "batch_size": ("batch size", "trainer's default"),
    "lr": ("learning rate", "trainer's default"),
    "seed": ("seed", "0"),
    "run_dir": ("run directory", "runs/<run-id>"),
}
#: Options the form shows; anything else given on the command line is kept as given.
FORM_ORDER = (
    "trainer",
    "script",
    "script_args",
    "local_rank_arg",
    "launcher",
    "device",
    "backend",
    "amp",
    "world_size",
    "oversubscribe",
    "workers",
    "epochs",
    "batch_size",
    "lr",
    "seed",
    "run_dir",
)
#: Rows a script does not take: the built-in trainers' options on the form (``--script``
#: refuses them) and AMP (a script does its own autocast); the trainer row is the choice itself.
SCRIPT_HIDDEN = tuple(
    name for name in FORM_ORDER if name in (*TRAINER_OPTIONS, "amp") and name != "trainer"
)
#: Options checked against the machine (torch must have answered before they are judged).
MACHINE_OPTIONS = ("device", "backend", "amp", "world_size", "workers")
#: Choice fields: raw option name -> choices.
SELECT_FIELDS = {
    "launcher": LAUNCHERS,
    "device": DEVICE_CHOICES,
    "backend": BACKEND_CHOICES,
    "amp": AMP_MODES,
}
#: Text fields after the choices, in form order.
NUMBER_FIELDS = ("world_size", "workers", "epochs", "batch_size", "lr", "seed", "run_dir")


class LaunchScreen(Screen):
    """Fill in the run options, launch (Enter, F5) or reopen a recent run."""

    #: Under 112 columns the form and the side panel share the width (app.tcss:
    #: ``LaunchScreen.-narrow``): at 80 the side panel showed its first 20 columns.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (112, "-wide")]

    BINDINGS = [
        Binding("f5,ctrl+l", "launch", "Launch"),
        Binding("ctrl+r", "reload_runs", "Reload runs"),
        Binding("ctrl+q", "app.quit", "Quit"),
    ]

    @dataclass
    class LaunchRequested(Message):
        """The form holds a valid run: launch it."""

        config: RunConfig
        raw: dict[str, Any]

    @dataclass
    class ReplayRequested(Message):
        """Open a recent run in the run screen."""

        run_dir: Path

    @dataclass
    class MachineDetected(Message):
        info: HostInfo

    @dataclass
    class RunsListed(Message):
        runs: list[RecentRun]

    def __init__(self, raw: Mapping[str, Any] | None = None, runs_root: Path = Path("runs")):
        super().__init__()
        self.raw_given = dict(raw or {})
        self.runs_root = runs_root
        self.recent: list[RecentRun] = []
        self.errors: list[ConfigError] = []

    # -- layout -------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="launch-body"):
            with VerticalScroll(id="form"):
                yield Static("New run", classes="panel-title")
                yield from self._field(
                    "trainer",
                    Select(
                        [(name, name) for name in trainer_names()] + [("own script…", OWN_SCRIPT)],
                        value=DEFAULT_TRAINER,
                        allow_blank=False,
                        compact=True,
                        id="f-trainer",
                    ),
                )
                yield from self._text_field("script")
                yield from self._text_field("script_args")
                yield from self._text_field("local_rank_arg")
                yield from self._field(
                    "launcher",
                    Select(
                        [(name, name) for name in LAUNCHERS],
                        prompt="default",
                        compact=True,
                        id="f-launcher",
                    ),
                )
                yield from self._field(
                    "device",
                    Select(
                        [(name, name) for name in DEVICE_CHOICES],
                        value="auto",
                        allow_blank=False,
                        compact=True,
                        id="f-device",
                    ),
                )
                yield from self._field(
                    "backend",
                    Select(
                        [(name, name) for name in BACKEND_CHOICES],
                        value="auto",
                        allow_blank=False,
                        compact=True,
                        id="f-backend",
                    ),
                )
                yield from self._field(
                    "amp",
                    Select(
                        [(name, name) for name in AMP_MODES],
                        value="off",
                        allow_blank=False,
                        compact=True,
                        id="f-amp",
                    ),
                    label="AMP",
                )
                yield from self._text_field("world_size")
                yield from self._field(
                    "oversubscribe",
                    Checkbox("more than 4 CPU ranks per core", compact=True, id="f-oversubscribe"),
                    label="oversubscribe",
                )
                for name in NUMBER_FIELDS[1:]:
                    yield from self._text_field(name)
                yield Static(id="form-errors", classes="field-error")
                with Horizontal(id="launch-row"):
                    yield Button("Launch (F5)", variant="success", id="launch", disabled=True)
                    yield Static(id="launch-status")
            with Vertical(id="side"):
                yield Static("Machine", classes="panel-title")
                yield Static(Text("detecting GPUs and CPUs…", style="dim"), id="machine")
                yield Static("Recent runs (Enter opens a replay)", classes="panel-title")
                yield Static(id="recent-empty")
                yield DataTable(id="recent", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def _field(self, name: str, widget: Any, label: str | None = None) -> ComposeResult:
        with Horizontal(classes="field", id=f"row-{name}"):
            yield Label(label or name.replace("_", " "), classes="field-label")
            yield widget
        yield Static(classes="field-hint", id=f"hint-{name}")
        yield Static(classes="field-error", id=f"err-{name}")

    def _text_field(self, name: str) -> ComposeResult:
        label, placeholder = TEXT_FIELDS[name]
        yield from self._field(
            name, Input(placeholder=placeholder, compact=True, id=f"f-{name}"), label=label
        )

    def on_mount(self) -> None:
        table = self.query_one("#recent", DataTable)
        table.add_columns("run", "outcome", "ranks", "target")
        self._prefill(self.raw_given)
        for widget in self.query(".field-hint, .field-error"):
            widget.display = False
        self._show_script_fields()
        info = self.app.host_info
        if info is None:
            self._detect()
        else:
            self._machine_known(info)
        self.action_reload_runs()
        self.query_one("#f-trainer", Select).focus()

    def _prefill(self, raw: Mapping[str, Any]) -> None:
        if raw.get("script") or raw.get("script_module"):
            self.query_one("#f-trainer", Select).value = OWN_SCRIPT
        elif raw.get("trainer") in trainer_names():
            self.query_one("#f-trainer", Select).value = raw["trainer"]
        for name, choices in SELECT_FIELDS.items():
            value = str(raw.get(name) or "").strip().lower()
            if value in choices:
                self.query_one(f"#f-{name}", Select).value = value
        self.query_one("#f-oversubscribe", Checkbox).value = bool(raw.get("oversubscribe"))
        for name in TEXT_FIELDS:
            value = raw.get(name)
            if name == "script_args":
                value = shlex.join(value) if value else ""
            elif name == "script" and raw.get("script_module"):
                value = f"-m {raw['script_module']}"  # as after python (or torchrun)
            if value is not None:
                self.query_one(f"#f-{name}", Input).value = str(value)

    # -- machine and recent runs (worker threads) ----------------------------------------------
    @work(thread=True, exclusive=True, group="detect")
    def _detect(self) -> None:
        self.post_message(self.MachineDetected(self.app.deps.detect_host()))

    def on_launch_screen_machine_detected(self, message: MachineDetected) -> None:
        self.app.host_info = message.info
        self._machine_known(message.info)

    def _machine_known(self, info: HostInfo) -> None:
        machine = info.machine
        lines = []
        if machine.cuda_devices:
            lines.append(Text(f"CUDA GPUs: {machine.cuda_devices}", style="bold green"))
        else:
            lines.append(Text(f"CUDA GPUs: none — {machine.cuda_reason}", style="yellow"))
        lines.extend(Text(f"  GPU {name}", style="cyan") for name in info.gpu_names)
        if info.gpu_reason and not info.gpu_names:
            lines.append(Text(f"No NVIDIA GPU: {info.gpu_reason}", style="dim"))
        lines.append(Text(f"CPU cores: {machine.cpu_count}"))
        if info.ram_total:
            lines.append(Text(f"RAM: {format_bytes(info.ram_total)}"))
        self.query_one("#machine", Static).update(Text("\n").join(lines))
        if not machine.cuda_devices:  # say in the choice itself why it cannot work here
            why = "needs a CUDA GPU (none here)"
            for name, options in (
                (
                    "device",
                    [("auto → cpu here", "auto"), ("cpu", "cpu"), (f"cuda — {why}", "cuda")],
                ),
                (
                    "backend",
                    [("auto → gloo here", "auto"), ("gloo", "gloo"), (f"nccl — {why}", "nccl")],
                ),
                ("amp", [("off", "off"), (f"fp16 — {why}", "fp16"), ("bf16", "bf16")]),
            ):
                select = self.query_one(f"#f-{name}", Select)
                value = select.value
                with self.prevent(Select.Changed):
                    select.set_options(options)
                    # Select only relabels on a change of value: step off and back.
                    select.value = options[-1][1] if value == options[0][1] else options[0][1]
                    select.value = value
        self.validate()

    def _show_defaults(self) -> None:
        """Placeholders that say what an empty world size and workers field will mean."""
        info = self.app.host_info
        if info is None:
            return
        machine = info.machine
        device = self.query_one("#f-device", Select).value
        cuda = machine.cuda_devices > 0 and device != "cpu"
        ranks = machine.cuda_devices if cuda else DEFAULT_CPU_WORLD_SIZE
        self.query_one("#f-world_size", Input).placeholder = (
            f"{ranks} (one per GPU)" if cuda else str(ranks)
        )
        try:
            world_size = int(self.query_one("#f-world_size", Input).value or ranks)
        except ValueError:
            world_size = ranks
        workers = default_workers("cuda" if cuda else "cpu", world_size, machine.cpu_count)
        self.query_one("#f-workers", Input).placeholder = f"auto: {workers}"

    def action_reload_runs(self) -> None:
        self._scan_runs()

    @work(thread=True, exclusive=True, group="runs")
    def _scan_runs(self) -> None:
        self.post_message(self.RunsListed(recent_runs(self.runs_root)))

    def on_launch_screen_runs_listed(self, message: RunsListed) -> None:
        self.recent = message.runs
        table = self.query_one("#recent", DataTable)
        table.clear()
        style = {
            "finished": "green",
            "failed": "bold red",
            "interrupted": "yellow",
            "stopped": "yellow",
        }
        for run in message.runs:
            table.add_row(  # a run's name and target as found on disk: never markup
                as_text(run.run_id),
                as_text(run.outcome, style=style.get(run.outcome, "")),
                str(run.world_size or "?"),
                as_text(run.target),
                key=str(run.run_dir),
            )
        empty = self.query_one("#recent-empty", Static)
        empty.display = not message.runs
        table.display = bool(message.runs)
        empty.update(as_text(f"no runs in {self.runs_root}/ yet", style="dim"))

    @on(DataTable.RowSelected, "#recent")
    def _open_recent(self, event: DataTable.RowSelected) -> None:
        key = event.row_key.value
        if key and any(str(r.run_dir) == key for r in self.recent):
            self.post_message(self.ReplayRequested(Path(key)))

    # -- the form -----------------------------------------------------------------------------
    def raw_options(self) -> dict[str, Any]:
        """The form as raw option values (what argparse would have produced)."""
        raw: dict[str, Any] = {
            k: v for k, v in self.raw_given.items() if k not in FORM_ORDER and k != "run_id"
        }
        trainer = self.query_one("#f-trainer", Select).value
        raw["script_module"] = None
        if trainer == OWN_SCRIPT:
            given = self.query_one("#f-script", Input).value
            module = module_in_script_field(given)
            if module is not None:  # "-m package.train", as after python (or torchrun)
                raw["script_module"], raw["script"] = module, None
            else:
                raw["script"] = given or None
            raw["trainer"] = None
        else:
            raw["trainer"] = trainer
            raw["script"] = None
        for name in SELECT_FIELDS:
            select = self.query_one(f"#f-{name}", Select)
            raw[name] = None if select.is_blank() else select.value
        for name in NUMBER_FIELDS:
            raw[name] = self.query_one(f"#f-{name}", Input).value or None
        raw["oversubscribe"] = self.query_one("#f-oversubscribe", Checkbox).value
        # a script's option (--local-rank-arg): a trainer reads LOCAL_RANK, and has no row
        local = self.query_one("#f-local_rank_arg", Input).value
        raw["local_rank_arg"] = (local or None) if trainer == OWN_SCRIPT else None
        if trainer == OWN_SCRIPT:
            for name in SCRIPT_HIDDEN:  # the trainers' options: a script reads its own
                raw[name] = None
        args = self.query_one("#f-script_args", Input).value
        try:
            raw["script_args"] = tuple(shlex.split(args))
        except ValueError:
            raw["script_args"] = tuple(args.split())
        return raw

    def check_options(self) -> list[ConfigError]:
        """The CLI's own checks on the form (none of the machine ones before it is known)."""
        info = self.app.host_info
        raw = self.raw_options()
        if info is None:
            # Not known yet: judge everything else now, the machine-dependent choices later
            # (check_options would otherwise import torch on the UI thread).
            raw = {
                **raw,
                "device": "cpu",
                "backend": "gloo",
                "amp": "off" if raw.get("amp") == "fp16" else raw.get("amp"),
                "sync_bn": False,
            }
            return check_run_options(raw, None, deep=False)
        # The checks that import torch or the trainer (--resume's header, the arguments
        # after --) run when Launch is pressed, not on every key.
        return check_run_options(raw, info.machine, deep=False)

    def validate(self) -> list[ConfigError]:
        errors = self.check_options()
        self.errors = errors
        by_field: dict[str, list[str]] = {}
        for error in errors:
            by_field.setdefault(error.field, []).append(str(error))
        shown = set()
        for name in FORM_ORDER:
            widget = self.query_one(f"#err-{name}", Static)
            messages = by_field.get(name)
            widget.display = bool(messages)
            if messages:
                shown.add(name)
                widget.update(as_text("✖ " + "\n✖ ".join(messages), newlines=True))
            self.query_one(f"#row-{name}").set_class(bool(messages), "-invalid")
        rest = [m for f, ms in by_field.items() if f not in shown for m in ms]
        general = self.query_one("#form-errors", Static)
        general.display = bool(rest)
        general.update(as_text("✖ " + "\n✖ ".join(rest) if rest else "", newlines=True))
        self._show_hints()
        self._show_defaults()
        ready = self.app.host_info is not None
        self.query_one("#launch", Button).disabled = bool(errors) or not ready
        status = self.query_one("#launch-status", Static)
        if not ready:
            status.update(Text("waiting for the machine check…", style="dim"))
        elif errors:
            status.update(Text(f"{len(errors)} problem(s) to fix", style="red"))
        else:
            status.update(Text("ready: Enter or F5 launches", style="green"))
        return errors

    def _show_hints(self) -> None:
        info = self.app.host_info
        device = self.query_one("#f-device", Select).value
        cuda = info is not None and info.machine.cuda_devices > 0 and device != "cpu"
        for name, auto_text in (
            (
                "device",
                lambda m: (
                    f"auto → cuda ({m.cuda_devices} GPU(s))"
                    if m.cuda_devices
                    else f"auto → cpu: {m.cuda_reason}"
                ),
            ),
            (
                "backend",
                lambda m: (
                    f"auto → nccl ({m.cuda_devices} CUDA GPU(s))"
                    if cuda
                    else (
                        "auto → gloo (CPU ranks)"
                        if m.cuda_devices
                        else f"auto → gloo: {m.cuda_reason}"
                    )
                ),
            ),
        ):
            hint = self.query_one(f"#hint-{name}", Static)
            if info is not None and self.query_one(f"#f-{name}", Select).value == "auto":
                hint.update(Text(auto_text(info.machine), style="dim"))
                hint.display = True
            else:
                hint.display = False
        launcher_hint = self.query_one("#hint-launcher", Static)
        if self.query_one("#f-launcher", Select).is_blank():
            script = self.query_one("#f-trainer", Select).value == OWN_SCRIPT
            launcher_hint.update(
                Text("default → " + ("torchrun (own script)" if script else "spawn"), style="dim")
            )
            launcher_hint.display = True
        else:
            launcher_hint.display = False

    def _show_script_fields(self) -> None:
        script = self.query_one("#f-trainer", Select).value == OWN_SCRIPT
        self.query_one("#row-script").display = script
        self.query_one("#row-local_rank_arg").display = script
        for name in SCRIPT_HIDDEN:  # the trainers' options
            self.query_one(f"#row-{name}").display = not script
        # A script's epochs go to the dashboard only (its progress and ETA)
        self.query_one("#f-epochs", Input).placeholder = (
            "your script's, for progress" if script else TEXT_FIELDS["epochs"][1]
        )

    @on(Input.Changed)
    @on(Select.Changed)
    @on(Checkbox.Changed)
    def _changed(self, event: Message) -> None:
        if isinstance(event, Select.Changed) and event.select.id == "f-trainer":
            self._show_script_fields()
        if self.is_mounted:
            self.validate()

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.action_launch()

    @on(Button.Pressed, "#launch")
    def _launch_pressed(self) -> None:
        self.action_launch()

    def action_launch(self) -> None:
        info = self.app.host_info
        if info is None:
            self.notify("still checking the machine; try again in a moment", severity="warning")
            return
        if self.validate():
            self.notify(
                printable(str(self.errors[0])),
                title="cannot launch",
                severity="error",
                markup=False,
            )
            return
        raw = self.raw_options()
        try:
            cfg = build_config(raw, info.machine)
        except ConfigError as exc:  # e.g. the script vanished since the last check
            self.notify(printable(str(exc)), title="cannot launch", severity="error", markup=False)
            return
        self.post_message(self.LaunchRequested(cfg, raw))
