"""How many epochs a user's script runs, read from its own arguments (``-- --epochs 3``): the
dashboard's ``epoch 1/3`` and ETA for the public scripts that take ``--epochs`` (VICReg, MoCo,
pytorch/examples, timm), which said "epochs unknown: ddptui --epochs N" beside the very flag."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddptui import protocol
from ddptui.argv import config_script_epochs, epochs_in_args
from ddptui.formatting import fmt_epoch, fmt_eta
from ddptui.run.rundir import load_run
from ddptui.run.state import RunState
from ddptui.runfiles import RunDir


@pytest.mark.parametrize(
    ("args", "found"),
    [
        (["--data-dir", "d", "--epochs", "3"], (3, "--epochs")),
        (["--epochs=4"], (4, "--epochs")),
        (["--num_epochs", "5"], (5, "--num_epochs")),
        (["--max-epochs", "6"], (6, "--max-epochs")),
        (["--num_train_epochs", "7"], (7, "--num_train_epochs")),
        (["--trainer.max_epochs", "8"], (8, "--trainer.max_epochs")),
        (["trainer.max_epochs=9"], (9, "trainer.max_epochs=")),
        (["epochs=10"], (10, "epochs=")),
        (["+epochs=12", "++trainer.max_epochs=13"], (13, "++trainer.max_epochs=")),  # Hydra's
        (["+epochs=12"], (12, "+epochs=")),
        (["xepochs=3", "-=3", "=3"], None),
        (["--epochs", "3", "--epochs", "11"], (11, "--epochs")),  # argparse keeps the last
        (["--num_train_epochs", "2.5"], None),  # no whole number of epochs
        (["--epochs", "0"], None),
        (["--epochs", "-1"], None),
        (["--epochs", "1e400"], None),
        (["--epochs", "inf"], None),
        (["--epochs", "\u0661\u0662"], None),  # Arabic-Indic digits: not read as 12
        (["--epochs", "9" * 5000], None),
        (["--epochs"], None),
        (["--epochs", ""], None),
        (["--", "--epochs", "3"], None),  # after a bare --: the script's positionals
        (["--start-epoch", "3", "--epoch", "4", "--warmup-epochs", "5"], None),
        (["--lr", "0.1"], None),
        (["a" * 100 + ".epochs=3"], None),  # a name too long to repeat on the console
        (["\x1b[31m.epochs=3"], (3, "\x1b[31m.epochs=")),  # the console escapes it
        ([], None),
        # yacs's KEY VALUE pairs (facebookresearch/pycls, SlowFast): a dotted key in capitals
        (["--cfg", "c.yaml", "NUM_GPUS", "2", "OPTIM.MAX_EPOCH", "3"], (3, "OPTIM.MAX_EPOCH")),
        (["SOLVER.MAX_EPOCH", "196", "TRAIN.BATCH_SIZE", "64"], (196, "SOLVER.MAX_EPOCH")),
        (["OPTIM.MAX_EPOCH", "3.5"], None),
        (["OPTIM.MAX_EPOCH"], None),
        (["optim.max_epoch", "3"], None),  # not yacs's: a positional pair of anything
        (["MAX_EPOCH", "3"], None),  # no dotted key: a positional
        (["OPTIM.WARMUP_EPOCHS", "5", "OPTIM.MAX_EPOCH", "9"], (9, "OPTIM.MAX_EPOCH")),
    ],
)
def test_the_epochs_a_script_is_told(args, found):
    assert epochs_in_args(args) == found


@pytest.mark.parametrize("args", [None, "--epochs 3", 3, {"--epochs": 3}, [3, None], [b"--epochs"]])
def test_script_args_of_any_shape_say_none(args):
    assert epochs_in_args(args) is None


@given(st.lists(st.one_of(st.text(max_size=12), st.sampled_from(["--epochs", "=", "--", "3"]))))
def test_any_arguments_give_a_count_in_range_or_none(args):
    found = epochs_in_args(args)
    assert found is None or (1 <= found[0] <= 1_000_000 and found[1] in "".join(args) + "=")


def test_only_a_users_script_is_read():
    """The built-in trainers say their epochs themselves (a status event)."""
    args = ["--epochs", "3"]
    assert config_script_epochs({"script": "train.py", "script_args": args}) == (3, "--epochs")
    assert config_script_epochs({"script_module": "pkg.train", "script_args": args})
    assert config_script_epochs({"trainer": "mnist", "script_args": args}) is None
    assert config_script_epochs(["script"]) is None


def _steps(state, epochs, steps=4, seq=0):
    """``steps`` steps of rank 0 in each of ``epochs``, after event ``seq``; the last seq."""
    for epoch in epochs:
        for _ in range(steps):
            seq += 1
            state.apply(
                protocol.Step(
                    run="r",
                    rank=0,
                    seq=seq,
                    t=float(seq),
                    step=seq,
                    epoch=epoch,
                    loss=1.0,
                    samples=8,
                    step_time=1.0,
                    samples_per_s=8.0,
                ),
                now=float(seq),
            )
    return seq


def test_the_scripts_epochs_give_the_progress_and_an_eta():
    state = RunState("r", 1, script_epochs=(3, "--epochs"))
    assert (state.epochs, state.epochs_flag) == (3, "--epochs")
    seq = _steps(state, [0, 1])
    assert fmt_epoch(state, 1) == "2/3"
    assert state.progress() == pytest.approx(1 / 3 + 1 / 3 * 3 / 4, abs=0.1)
    assert fmt_eta(state, float(seq)) not in ("--", "-- (epochs unknown: ddptui --epochs N)")


def test_ddptuis_own_epochs_and_a_ranks_word_come_first():
    state = RunState("r", 1, epochs=5, script_epochs=(3, "--epochs"))
    assert (state.epochs, state.epochs_flag) == (5, None)
    state = RunState("r", 1, script_epochs=(3, "--epochs"))
    state.apply(protocol.Status(run="r", rank=0, seq=0, t=0.0, state="started", epochs=7))
    assert (state.epochs, state.epochs_flag) == (7, None)


def test_a_script_that_steps_past_its_flag_takes_the_reading_back():
    """``--epochs`` meant something else (warm-up epochs, epochs per stage): once a rank
    steps in an epoch beyond it, the count is dropped rather than shown as ``epoch 4/3``; a
    count ddptui was told (``ddptui --epochs``) is kept whatever happens."""
    state = RunState("r", 1, script_epochs=(3, "--epochs"))
    seq = _steps(state, [0, 1, 2])
    assert state.epochs == 3
    _steps(state, [3], seq=seq)
    assert (state.epochs, state.epochs_flag) == (None, None)
    assert fmt_epoch(state, 3) == "3"
    state = RunState("r", 1, epochs=3)
    _steps(state, [0, 1, 2, 3])
    assert state.epochs == 3
    # Counted from 1 (pytorch/examples' MNIST: range(1, epochs + 1)): epoch 3 is the last.
    state = RunState("r", 1, script_epochs=(3, "--epochs"))
    _steps(state, [1, 2, 3])
    assert state.epochs == 3


def test_a_replayed_scripts_run_has_its_epochs(tmp_path):
    config = {
        "run_id": "r",
        "world_size": 1,
        "script": "main_vicreg.py",
        "script_args": ["--data-dir", "d", "--epochs", "2"],
    }
    files = RunDir(tmp_path)
    files.config.write_text(json.dumps(config))
    steps = (
        protocol.Step(run="r", rank=0, seq=seq, t=float(seq), step=seq, epoch=(seq - 1) // 2)
        for seq in range(1, 5)
    )
    files.events.write_bytes(b"".join(protocol.to_json(step) + b"\n" for step in steps))
    _, state, _ = load_run(tmp_path)
    assert (state.epochs, state.epochs_flag) == (2, "--epochs")
    assert fmt_epoch(state, 1) == "2/2"


def test_a_session_of_a_script_reads_its_epochs_and_the_console_names_them(tmp_path):
    from ddptui.headless import epochs_line
    from ddptui.run.config import build_config
    from ddptui.run.machine import Machine
    from ddptui.run.session import RunSession

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    raw = {
        "run_dir": str(tmp_path / "run"),
        "script": str(script),
        "script_args": ("--data", "d", "--epochs", "3"),
        "device": "cpu",
    }
    session = RunSession(build_config(raw, Machine(0, "none", 2)))
    assert (session.state.epochs, session.state.epochs_flag) == (3, "--epochs")
    assert (
        epochs_line(session.state)
        == "epochs: 3, as the script's --epochs 3 says (ddptui --epochs N to differ)"
    )
    session = RunSession(build_config({**raw, "epochs": "5"}, Machine(0, "none", 2)))
    assert (session.state.epochs, session.state.epochs_flag) == (5, None)
    assert epochs_line(session.state) is None
