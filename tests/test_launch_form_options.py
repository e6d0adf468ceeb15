"""The launch form's device, workers and oversubscribe fields: the same rules as the CLI
(``check_options``), placeholders that say what an empty field means, and the checks that
import torch or the trainer run when Launch is pressed. Fakes only: nothing is launched."""

from __future__ import annotations

from textual.widgets import Button, Checkbox, Input, Select

from ddptui.run.config import build_config
from ddptui.run.machine import Machine
from ddptui.tui.machine import HostInfo
from ddptui.tui.screens.launch import OWN_SCRIPT, LaunchScreen
from tests.tui_fixtures.fakes import GPU_HOST, NO_CUDA_HOST, fake_deps, primed_app

SIZE = (120, 50)


def _app(tmp_path, host=NO_CUDA_HOST, **raw):
    launched = []
    deps = fake_deps(host=host, session_factory=lambda cfg: launched.append(cfg))
    app = primed_app("run", deps=deps, host_info=host, raw={"run_dir": str(tmp_path / "r"), **raw})
    app.launched = launched
    return app


def _error(screen, field) -> str:
    widget = screen.query_one(f"#err-{field}")
    return str(widget.render()) if widget.display else ""


async def test_gpu_machine_defaults_and_the_cuda_rank_check(tmp_path):
    app = _app(tmp_path, host=GPU_HOST)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, LaunchScreen)
        assert screen.query_one("#f-world_size", Input).placeholder == "2 (one per GPU)"
        assert screen.query_one("#f-workers", Input).placeholder == "auto: 8"  # 32 cores / 2
        assert "auto → cuda (2 GPU(s))" in str(screen.query_one("#hint-device").render())
        screen.query_one("#f-world_size", Input).value = "3"
        await pilot.pause()
        text = _error(screen, "world_size")
        assert "more than the 2 GPU(s)" in text and "--device cpu" in text
        assert screen.query_one("#launch", Button).disabled
        screen.query_one("#f-device", Select).value = "cpu"  # the way out it names
        await pilot.pause()
        assert _error(screen, "world_size") == "" and screen.validate() == []
        raw = screen.raw_options()
        assert (raw["device"], raw["world_size"]) == ("cpu", "3")
        assert screen.query_one("#f-world_size", Input).placeholder == "2"


async def test_device_cuda_without_a_gpu_is_explained(tmp_path):
    app = _app(tmp_path, device="cuda")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert "--device cuda needs a CUDA GPU" in _error(app.screen, "device")


async def test_oversubscribe_and_workers_use_the_clis_limits(tmp_path):
    two_cores = HostInfo(Machine(0, "no CUDA here", 2), None)
    app = _app(tmp_path, host=two_cores, world_size="9", workers="65")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert "more than 8 ranks for the 2 usable CPU core(s)" in _error(screen, "world_size")
        assert "--workers must be at most 64" in _error(screen, "workers")
        screen.query_one("#f-workers", Input).value = "1"
        screen.query_one("#f-oversubscribe", Checkbox).value = True
        await pilot.pause()
        assert screen.validate() == []
        assert screen.raw_options()["oversubscribe"] is True


async def test_oversubscribe_from_the_command_line_prefills_the_form(tmp_path):
    app = _app(tmp_path, oversubscribe=True, device="cpu", workers="2")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        raw = app.screen.raw_options()
        assert (raw["oversubscribe"], raw["device"], raw["workers"]) == (True, "cpu", "2")


async def test_own_script_hides_the_trainers_options(tmp_path):
    app = _app(tmp_path, workers="3", amp="bf16")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert screen.query_one("#row-workers").display and screen.query_one("#row-amp").display
        screen.query_one("#f-trainer", Select).value = OWN_SCRIPT
        await pilot.pause()
        # a script reads its own options (workers, batch size, lr, seed) and does its own
        # autocast (or none): the rows go, and so do their values
        screen.query_one("#f-lr", Input).value = "0.5"
        for name in ("workers", "amp", "batch_size", "lr", "seed"):
            assert not screen.query_one(f"#row-{name}").display, name
            assert screen.raw_options()[name] is None, name


async def test_trainer_arguments_are_checked_when_launch_is_pressed(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        screen.query_one("#f-script_args", Input).value = "--epochs x"
        await pilot.pause()
        assert screen.validate() == []  # not on every key: it imports the trainer
        await pilot.press("f5")
        await pilot.pause()
        assert isinstance(app.screen, LaunchScreen) and app.launched == []
        notes = [n.message for n in app._notifications]
        assert any("the synthetic trainer refuses its arguments" in m for m in notes)


async def test_the_script_field_takes_a_module_as_python_does(tmp_path, monkeypatch):
    """``-m package.train`` in the script field is ``--module package.train``; ``ddptui
    --module`` prefills it so; a module python cannot find is named at the field."""
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    app = _app(tmp_path, script_module="mypkg.train")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert screen.query_one("#f-trainer", Select).value == OWN_SCRIPT
        assert screen.query_one("#f-script", Input).value == "-m mypkg.train"
        raw = screen.raw_options()
        assert (raw["script_module"], raw["script"]) == ("mypkg.train", None)
        assert screen.validate() == []
        screen.query_one("#f-script", Input).value = "-m mypkg.nosuch"
        await pilot.pause()
        assert "no module 'mypkg.nosuch'" in _error(screen, "script")
        screen.query_one("#f-script", Input).value = str(package / "train.py")  # a path again
        await pilot.pause()
        raw = screen.raw_options()
        assert (raw["script_module"], raw["script"]) == (None, str(package / "train.py"))
        assert _error(screen, "script") == "" and screen.validate() == []


async def test_a_script_takes_its_local_rank_as_an_argument_from_the_form(tmp_path):
    """The crash of a launch-era script says to add --local-rank-arg: the form has it, for a
    script only (a trainer reads LOCAL_RANK), checked as on the command line, and prefilled
    from it."""
    script = tmp_path / "main.py"
    script.write_text("print('hi')\n")
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        row = screen.query_one("#row-local_rank_arg")
        assert not row.display and screen.raw_options()["local_rank_arg"] is None
        screen.query_one("#f-trainer", Select).value = OWN_SCRIPT
        screen.query_one("#f-script", Input).value = str(script)
        await pilot.pause()
        assert row.display and screen.raw_options()["local_rank_arg"] is None
        field = screen.query_one("#f-local_rank_arg", Input)
        field.value = "--local rank"
        await pilot.pause()
        assert "--local-rank-arg must name an option" in _error(screen, "local_rank_arg")
        field.value = "local_rank"
        await pilot.pause()
        assert screen.validate() == []
        # what Launch builds from the form
        assert build_config(screen.raw_options(), NO_CUDA_HOST.machine).local_rank_arg == (
            "--local_rank"
        )
    again = _app(tmp_path, script=str(script), local_rank_arg="--local-rank")
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert again.screen.query_one("#f-local_rank_arg", Input).value == "--local-rank"
        assert again.screen.raw_options()["local_rank_arg"] == "--local-rank"
