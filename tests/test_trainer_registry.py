"""Trainers come from the ``ddptui.trainers`` entry points: ddptui's core never imports the
``trainers`` package for names, and a user's package adds a trainer the CLI accepts and the
form lists (tested with a fake installed distribution on sys.path)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from ddptui import cli
from ddptui.run.config import build_config
from ddptui.run.machine import Machine
from ddptui.run.options import ConfigError
from ddptui.run.registry import TrainerSpec, registry
from tests.helpers import ROOT

CPU = Machine(0, "none", cpu_count=2)


def _fake_distribution(root, name="tinytrainer", entry_points=None):
    """An installed distribution as importlib.metadata finds it: NAME-1.0.dist-info."""
    info = root / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points or "")
    return root


USER_PACKAGE = {
    "tinytrainer_specs.py": """
        from ddptui.run.registry import TrainerSpec

        TINY = TrainerSpec(name="tiny", module="tinytrainer_train", models=("mlp", "cnn"))
        NOT_A_SPEC = 42
    """,
    "tinytrainer_train.py": """
        def main(argv):
            return 0
    """,
}

ENTRY_POINTS = """
[ddptui.trainers]
tiny = tinytrainer_specs:TINY
plain = tinytrainer_train
broken = tinytrainer_specs:NOT_A_SPEC
missing = no_such_module_anywhere:SPEC
synthetic = tinytrainer_specs:TINY
"""


@pytest.fixture
def user_trainer(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    for name, text in USER_PACKAGE.items():
        (site / name).write_text(textwrap.dedent(text))
    _fake_distribution(site, entry_points=ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(site))
    registry.cache_clear()
    yield site
    registry.cache_clear()
    for module in ("tinytrainer_specs", "tinytrainer_train"):
        sys.modules.pop(module, None)


def test_core_modules_do_not_import_trainers_or_torch():
    code = textwrap.dedent("""
        import sys
        import ddptui.run.config, ddptui.cli, ddptui.run.registry
        before = sorted(m for m in sys.modules if m.split(".")[0] in ("trainers", "torch"))
        from ddptui.run.config import build_config
        cfg = build_config({"device": "cpu", "run_dir": "/tmp/ddptui-registry-test-unused"})
        after = sorted(m for m in sys.modules if m.split(".")[0] == "torch")
        print(before, after, cfg.trainer_module)
    """)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "[]", "trainers.synthetic"]


def test_builtin_trainers_are_registered():
    registry.cache_clear()
    specs = registry().specs
    assert list(specs)[:4] == ["synthetic", "mnist", "cifar10", "imagefolder"]
    assert specs["cifar10"].models == ("resnet18", "resnet50")
    assert specs["mnist"].needs_data_dir and specs["synthetic"].model == "smallcnn"


def test_a_users_package_adds_a_trainer(user_trainer, tmp_path):
    found = registry()
    assert found.specs["tiny"].module == "tinytrainer_train"
    assert found.specs["plain"] == TrainerSpec(name="plain", module="tinytrainer_train")
    assert found.specs["synthetic"].module == "trainers.synthetic"  # a built-in keeps its name
    assert "not a ddptui TrainerSpec" in found.problems["broken"]
    assert "ModuleNotFoundError" in found.problems["missing"]
    assert "registers 'synthetic' again" in found.problems["synthetic"]

    cfg = build_config({"trainer": "tiny", "model": "cnn", "run_dir": str(tmp_path / "r")}, CPU)
    assert (cfg.trainer, cfg.trainer_module, cfg.model) == ("tiny", "tinytrainer_train", "cnn")
    with pytest.raises(ConfigError, match=r"unknown model 'x' for the tiny trainer \(choose"):
        build_config({"trainer": "tiny", "model": "x", "run_dir": str(tmp_path / "r")}, CPU)
    plain = build_config({"trainer": "plain", "model": "any", "run_dir": str(tmp_path / "r")}, CPU)
    assert plain.model == "any"  # no models declared: the trainer judges --model itself
    with pytest.raises(ConfigError, match="trainer 'broken' cannot be used: entry point"):
        build_config({"trainer": "broken"}, CPU)


def test_the_cli_accepts_a_registered_trainer(user_trainer, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # Accepted as a trainer: what refuses the run is its model, then the world size.
    assert cli.main(["--no-ui", "--trainer", "tiny", "--model", "rnn"]) == 2
    assert "unknown model 'rnn' for the tiny trainer" in capsys.readouterr().err
    assert cli.main(["--no-ui", "--trainer", "tiny", "--world-size", "100000"]) == 2
    assert "world size 100000 is more than" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    with pytest.raises(SystemExit):
        cli.run_parser().parse_args(["--help"])
    assert "tiny" in capsys.readouterr().out


async def test_the_form_lists_a_registered_trainer(user_trainer, tmp_path):
    from textual.widgets import Select

    from tests.tui_fixtures.fakes import primed_app

    app = primed_app("run", raw={"run_dir": str(tmp_path / "r")})
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        select = app.screen.query_one("#f-trainer", Select)
        select.value = "tiny"  # raises InvalidSelectValueError when not listed
        await pilot.pause()
        assert app.screen.raw_options()["trainer"] == "tiny"
        assert app.screen.validate() == []


def test_installed_metadata_of_ddptui_replaces_the_builtin_fallback(tmp_path, monkeypatch):
    """Once ddptui's own metadata carries the entry points, they are the built-ins."""
    site = _fake_distribution(
        tmp_path, "ddptui", "[ddptui.trainers]\nsynthetic = trainers.specs:SYNTHETIC\n"
    )
    monkeypatch.syspath_prepend(str(site))
    registry.cache_clear()
    try:
        assert list(registry().specs) == ["synthetic"]
    finally:
        registry.cache_clear()
