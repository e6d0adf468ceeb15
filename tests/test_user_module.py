"""``--module NAME``: the user's code run as ``python -m NAME`` (torchrun's ``-m``), as
open_clip's README runs its training (``torchrun ... -m open_clip_train.main``)."""

import json
import textwrap
import time

import pytest

from ddptui import cli
from ddptui.run.check_target import check_module
from ddptui.run.config import build_config, check_options
from ddptui.run.machine import Machine
from ddptui.run.options import ConfigError, module_in_script_field, resume_command
from ddptui.run.session import RunSession
from tests.helpers import ROOT, processes_of_run, read_events

CPU = Machine(0, "no CUDA", 2)

#: A package whose training module imports its sibling relatively (as a package's modules do:
#: run as a file, ``from .steps import`` fails) and whose ``__init__`` leaves a mark when run.
TRAIN = """\
    import os
    import sys

    import torch
    import torch.distributed as dist

    from .steps import STEPS

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS * int(sys.argv[sys.argv.index("--times") + 1])):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    here = os.path.dirname(os.path.abspath(__file__))
    print(
        "as-module", __name__, __package__, os.path.basename(sys.argv[0]),
        sys.path[0] == os.getcwd(), here in sys.path, flush=True,
    )
    dist.destroy_process_group()
"""


def make_package(root, name="mypkg"):
    package = root / name
    package.mkdir(parents=True)
    mark = root / "init-ran"
    (package / "__init__.py").write_text(f"open({str(mark)!r}, 'a').write('x')\n")
    (package / "steps.py").write_text("STEPS = 3\n")
    (package / "train.py").write_text(textwrap.dedent(TRAIN))
    return package, mark


def test_a_module_is_found_from_the_current_directory_without_running_its_package(
    tmp_path, monkeypatch
):
    package, mark = make_package(tmp_path)
    (package / "__main__.py").write_text("from . import train\n")
    monkeypatch.chdir(tmp_path)
    assert check_module(" mypkg.train ") == ("mypkg.train", str(package / "train.py"))
    assert check_module("mypkg") == ("mypkg", str(package / "__main__.py"))  # its __main__
    assert not mark.exists()  # found, not imported: a package's __init__ (torch...) not run
    cfg = build_config({"script_module": "mypkg.train", "script_args": ("--times", "1")}, CPU)
    assert (cfg.script_module, cfg.script) == ("mypkg.train", str(package / "train.py"))
    assert cfg.launcher == "torchrun" and cfg.trainer_argv() == ["--times", "1"]
    assert cfg.target_label == "module mypkg.train"
    assert "--module mypkg.train" in resume_command(cfg)
    assert "--script" not in resume_command(cfg)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nosuch.train", "no module 'nosuch' in the current directory or on sys.path"),
        ("mypkg.nosuch", "no module 'mypkg.nosuch'"),
        ("mypkg.steps.x", "'mypkg.steps' is a module, not a package"),
        ("mypkg", "a package without a __main__ module cannot be run"),
        ("sys", "built into Python"),
        ("mypkg..train", "is not a module name"),
        ("2pkg.train", "is not a module name"),
        ("mypkg.class", "is not a module name"),
        ("my-pkg.train", "is not a module name"),
        ("a" * 300, "is not a module name"),
        ("mypkg.broken", "is not valid Python: line 1"),
    ],
)
def test_a_module_python_could_not_run_is_refused_in_one_line(tmp_path, monkeypatch, name, message):
    package, _ = make_package(tmp_path)
    (package / "broken.py").write_text("def (:\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        check_module(name)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith("--module ") or "module " in str(caught.value)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"script": "x.py"}, "--script and --module both name your code: give one of them"),
        ({"lr": "0.1"}, "--module runs your own module: --lr is for the built-in trainers"),
        ({"trainer": "mnist"}, "--module runs your own module: --trainer is for the built-in"),
    ],
)
def test_a_module_with_a_script_or_a_trainers_option_is_refused(
    capsys, tmp_path, monkeypatch, raw, message
):
    make_package(tmp_path)
    (tmp_path / "x.py").write_text("pass\n")
    monkeypatch.chdir(tmp_path)
    given = ["--no-ui", "--module", "mypkg.train", "--run-dir", str(tmp_path / "run")]
    for key, value in raw.items():
        given += [f"--{key}", value]
    assert cli.main(given) == 2
    err = capsys.readouterr().err
    assert err == f"ddptui: error: {message}\n" or (err.count("\n") == 1 and message in err)
    assert not (tmp_path / "run").exists()
    if "script" in raw:  # the config layer says the same (the form's path)
        problems = check_options({"script_module": "mypkg.train", **raw}, CPU)
        assert any(message in str(p) for p in problems)


def test_the_forms_script_field_takes_a_module_as_python_does():
    assert module_in_script_field("-m mypkg.train") == "mypkg.train"
    assert module_in_script_field("  -mmypkg.train ") == "mypkg.train"
    assert module_in_script_field("-m") is None
    assert module_in_script_field("train.py") is None
    assert module_in_script_field("dir/-m.py") is None


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
def test_a_module_runs_on_every_rank_as_python_m_runs_it(tmp_path, monkeypatch, launcher):
    """As ``python -m``: ``__main__`` with its package known (its relative import works), the
    current directory first on sys.path and the module's own directory not on it (run as a
    file, a package's ``data.py`` would shadow any other ``data`` module)."""
    _, _ = make_package(tmp_path / "src")
    monkeypatch.chdir(tmp_path / "src")
    raw = {
        "run_dir": str(tmp_path / "run"),
        "script_module": "mypkg.train",
        "script_args": ("--times", "2"),
        "world_size": "2",
        "launcher": launcher,
    }
    session = RunSession(build_config(raw, CPU))
    deadline = time.monotonic() + 120
    try:
        with session:
            session.start()
            while session.poll() is None and time.monotonic() < deadline:
                session.pump(0.1)
            result = session.result
    finally:
        leftover = processes_of_run(session.cfg.run_id)
        for proc in leftover:
            proc.kill()
    assert result is not None and result.ok, result
    assert leftover == []
    events = read_events(session.run_dir)
    steps = sum(e["steps"] for e in events if e["kind"] == "step")
    assert steps == 2 * 3 * 2  # two ranks, 3 x --times 2
    for rank in (0, 1):
        log = (session.run_dir / f"rank-{rank}.log").read_text()
        assert "as-module __main__ mypkg train.py True False" in log, log
    saved = json.loads((session.run_dir / "config.json").read_text())
    assert saved["script_module"] == "mypkg.train"


def test_rank_entry_takes_a_module_and_the_driver_passes_it_on():
    from ddptui.argv import target_args
    from ddptui.run.launcher import Launcher

    launcher = Launcher(
        "torchrun", 2, ROOT, "r", None, script="/x/mypkg/train.py", script_module="mypkg.train"
    )
    assert launcher.driver_args()[-3:] == ["--run-module", "mypkg.train", "--"]
    assert target_args(None, "/x/train.py", None) == ["--script", "/x/train.py"]
    assert target_args("trainers.synthetic", None, None) == ["--module", "trainers.synthetic"]


def test_a_modules_run_resumes_from_its_run_directory_as_a_module(tmp_path, monkeypatch):
    """``--resume RUN_DIR`` of a ``--module`` run: the module again (found anew from its name,
    its saved file path not taken as a ``--script`` beside it), its arguments, none of the
    trainers' options."""
    from ddptui.runfiles import RunDir, write_json_atomic

    package, _ = make_package(tmp_path)
    monkeypatch.chdir(tmp_path)
    raw = {"script_module": "mypkg.train", "script_args": ("--times", "1")}
    cfg = build_config({**raw, "run_dir": str(tmp_path / "run")}, CPU)
    RunDir(cfg.run_dir).path.mkdir(parents=True)
    write_json_atomic(RunDir(cfg.run_dir).config, cfg.to_json_dict())
    RunDir(cfg.run_dir).checkpoint.write_bytes(b"x")
    merged = cli.continue_run_dir({"resume": cfg.run_dir, "script_args": ()})
    assert merged["script_module"] == "mypkg.train" and not merged.get("script")
    assert merged["script_args"] == ("--times", "1") and "seed" not in merged
    again = build_config({**merged, "run_dir": str(tmp_path / "run2")}, CPU)
    assert (again.script_module, again.script) == ("mypkg.train", str(package / "train.py"))
    assert again.resume == str(RunDir(cfg.run_dir).checkpoint)
    other = tmp_path / "other.py"
    other.write_text("pass\n")  # a target given again wins over the saved one
    merged = cli.continue_run_dir({"resume": cfg.run_dir, "script": str(other)})
    assert merged["script"] == str(other) and not merged.get("script_module")
