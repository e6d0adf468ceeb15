"""What a rank of the built-in synthetic trainer imports: never torchvision (≈180 MiB and
seconds per rank on a busy machine, for image datasets and models it does not use) and never
the dashboard. In a fresh interpreter, as a rank starts."""

from __future__ import annotations

import json
import subprocess
import sys

RANK = """
import json, sys
import ddptui.rank.entry
from trainers import synthetic
from trainers.options import parse_config
config = parse_config(synthetic.build_arg_parser(), ["--epochs", "1"])
data = synthetic.build_data(config, None, None)
synthetic.build_model(config, data.num_classes)
print(json.dumps(sorted(m for m in ("torchvision", "textual", "rich") if m in sys.modules)))
"""


def test_the_synthetic_trainer_imports_neither_torchvision_nor_the_dashboard():
    done = subprocess.run(
        [sys.executable, "-c", RANK], capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


CHECK = """
import json, sys
from ddptui.run.check_target import trainer_args_problem
from ddptui.run.registry import registry
said = {
    name: [trainer_args_problem(spec, ("--epochs", "2")), trainer_args_problem(spec, ("--lr", "x"))]
    for name, spec in registry().specs.items()
}
print(json.dumps({"torch": "torch" in sys.modules, "said": said}))
"""


def test_checking_a_built_in_trainers_arguments_imports_no_torch():
    """ddptui (and the dashboard) check the arguments after ``--`` before launching: with the
    trainer's own parser, built without torch (1.6 s of CPU before any rank started)."""
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["torch"] is False
    assert set(out["said"]) == {"synthetic", "mnist", "cifar10", "imagefolder"}
    for name, (good, bad) in out["said"].items():
        assert good is None
        assert (
            bad == f"the {name} trainer refuses its arguments: argument --lr: invalid lr value: 'x'"
        )


def test_each_trainer_parses_with_the_parser_ddptui_checks_with():
    from trainers import cifar10, imagefolder, mnist, parsers, synthetic

    for module in (synthetic, mnist, cifar10, imagefolder):
        name = module.__name__.rsplit(".", 1)[1]
        own, checked = module.build_arg_parser(), getattr(parsers, name)()
        assert own.description == module.__doc__
        argv = ["--epochs", "2", "--batch-size", "8"]
        assert vars(own.parse_args(argv)) == vars(checked.parse_args(argv))
