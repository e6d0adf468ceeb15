import pytest

from ddptui.config import ConfigError, Machine, build_config, check_options

CPU = Machine(cuda_devices=0, cuda_reason="no CUDA device visible", cpu_count=2)
TWO_GPUS = Machine(cuda_devices=2, cuda_reason="", cpu_count=16)


def test_defaults_on_cpu(tmp_path):
    cfg = build_config({"run_dir": str(tmp_path / "r")}, CPU)
    assert (cfg.trainer, cfg.launcher, cfg.backend, cfg.amp, cfg.world_size) == (
        "synthetic",
        "spawn",
        "gloo",
        "off",
        2,
    )
    assert cfg.run_dir == str(tmp_path / "r") and cfg.run_id


def test_auto_backend_picks_nccl_with_cuda():
    assert build_config({}, TWO_GPUS).backend == "nccl"
    assert build_config({"backend": "auto"}, CPU).backend == "gloo"


def test_script_defaults_to_torchrun_and_resolves_path(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    cfg = build_config({"script": str(script), "script_args": ("--x", "1")}, CPU)
    assert cfg.launcher == "torchrun" and cfg.script == str(script.resolve())
    assert cfg.trainer_argv() == ["--x", "1"]


@pytest.mark.parametrize(
    ("raw", "machine", "field", "message"),
    [
        ({"world_size": "0"}, CPU, "world_size", "--world-size must be at least 1"),
        ({"world_size": "two"}, CPU, "world_size", "--world-size must be a whole number"),
        ({"world_size": "1.5"}, CPU, "world_size", "whole number"),
        ({"backend": "mpi"}, CPU, "backend", "unknown backend 'mpi'"),
        ({"amp": "fp8"}, CPU, "amp", "unknown amp 'fp8'"),
        ({"launcher": "slurm"}, CPU, "launcher", "unknown launcher 'slurm'"),
        ({"trainer": "gpt5"}, CPU, "trainer", "unknown trainer 'gpt5'"),
        ({"backend": "nccl"}, CPU, "backend", "backend nccl needs a CUDA GPU"),
        ({"amp": "fp16"}, CPU, "amp", "AMP fp16 needs a CUDA GPU"),
        ({"backend": "nccl", "world_size": "3"}, TWO_GPUS, "world_size", "more than the 2 GPU"),
        ({"epochs": "0"}, CPU, "epochs", "--epochs must be at least 1"),
        ({"batch_size": "-4"}, CPU, "batch_size", "--batch-size must be at least 1"),
        ({"lr": "0"}, CPU, "lr", "--lr must be greater than 0"),
        ({"lr": "fast"}, CPU, "lr", "--lr must be a number"),
        ({"script": "/nonexistent/train.py"}, CPU, "script", "script not found"),
        ({"resume": "/nonexistent/ckpt.pt"}, CPU, "resume", "cannot read resume checkpoint"),
        ({"init_method": "udp://x"}, CPU, "init_method", "--init-method must be"),
        ({"sync_bn": True}, CPU, "sync_bn", "--sync-bn needs a CUDA GPU"),
        (
            {"trainer": "mnist", "data_dir": "/no/data"},
            CPU,
            "data_dir",
            "MNIST not found in /no/data (expected MNIST/raw/train-images-idx3-ubyte",
        ),
        (
            {"trainer": "cifar10", "data_dir": "/no/data"},
            CPU,
            "data_dir",
            "CIFAR-10 not found in /no/data",
        ),
        (
            {"trainer": "imagefolder", "data_dir": "/no/data"},
            CPU,
            "data_dir",
            "image folder /no/data has no train/ directory",
        ),
    ],
)
def test_bad_values_are_refused_with_one_line(raw, machine, field, message):
    with pytest.raises(ConfigError) as info:
        build_config(raw, machine)
    assert info.value.field == field
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_check_options_reports_every_problem_in_form_order():
    errors = check_options({"world_size": "x", "epochs": "0", "amp": "fp16"}, CPU)
    assert [e.field for e in errors] == ["world_size", "epochs", "amp"]


def test_fp16_and_nccl_fine_with_gpus():
    cfg = build_config({"backend": "nccl", "amp": "fp16", "world_size": "2"}, TWO_GPUS)
    assert (cfg.backend, cfg.amp) == ("nccl", "fp16")


def test_trainer_argv_carries_every_option(tmp_path):
    ckpt = tmp_path / "c.pt"
    ckpt.write_bytes(b"x")
    cfg = build_config(
        {
            "epochs": "3",
            "batch_size": "16",
            "lr": "0.1",
            "seed": "7",
            "data_dir": "/d",
            "resume": str(ckpt),
            "sync_bn": True,
            "init_method": "file:///tmp/x",
            "model": "resnet50",
            "amp": "bf16",
            "run_dir": str(tmp_path / "run"),
        },
        TWO_GPUS,
    )
    argv = cfg.trainer_argv()
    joined = " ".join(argv)
    for part in (
        "--epochs 3",
        "--batch-size 16",
        "--lr 0.1",
        "--seed 7",
        "--data-dir /d",
        f"--resume {ckpt}",
        "--sync-bn",
        "--init-method file:///tmp/x",
        "--model resnet50",
        "--amp bf16",
        "--backend nccl",
        f"--checkpoint {tmp_path / 'run' / 'checkpoint.pt'}",
    ):
        assert part in joined


def test_download_request_skips_the_data_check():
    cfg = build_config(
        {"trainer": "mnist", "data_dir": "/no/data", "script_args": ("--download",)}, CPU
    )
    assert cfg.trainer_argv()[-1] == "--download"


def test_a_run_directory_that_holds_a_run_is_refused(tmp_path):
    (tmp_path / "events.jsonl").write_text("")
    with pytest.raises(ConfigError, match="run directory already holds a run") as info:
        build_config({"run_dir": str(tmp_path)}, CPU)
    assert info.value.field == "run_dir"
    build_config({"run_dir": str(tmp_path / "fresh")}, CPU)  # a new one is fine


def test_a_run_directory_under_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="run directory is a file|cannot create or write"):
        build_config({"run_dir": str(tmp_path / "f" / "run")}, CPU)
