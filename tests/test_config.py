import pytest

from ddptui.run.config import build_config, check_options
from ddptui.run.machine import Machine
from ddptui.run.options import ConfigError

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
        ({"launcher": "mpirun"}, CPU, "launcher", "unknown launcher 'mpirun'"),
        ({"trainer": "gpt5"}, CPU, "trainer", "unknown trainer 'gpt5'"),
        ({"backend": "nccl"}, CPU, "backend", "backend nccl needs a CUDA GPU"),
        ({"amp": "fp16"}, CPU, "amp", "AMP fp16 needs a CUDA GPU"),
        ({"backend": "nccl", "world_size": "3"}, TWO_GPUS, "world_size", "more than the 2 GPU"),
        ({"epochs": "0"}, CPU, "epochs", "--epochs must be at least 1"),
        ({"batch_size": "-4"}, CPU, "batch_size", "--batch-size must be at least 1"),
        ({"lr": "0"}, CPU, "lr", "--lr must be greater than 0"),
        ({"lr": "fast"}, CPU, "lr", "--lr must be a number"),
        ({"script": "/nonexistent/train.py"}, CPU, "script", "script not found"),
        ({"script": "/"}, CPU, "script", "--script names a directory, not a file: /"),
        ({"script": "/dev/null"}, CPU, "script", "--script names no regular file: /dev/null"),
        ({"resume": "/nonexistent/ckpt.pt"}, CPU, "resume", "cannot read resume checkpoint"),
        ({"init_method": "udp://x"}, CPU, "init_method", "--init-method must be"),
        ({"model": "nonsense"}, CPU, "model", "unknown model 'nonsense' for the synthetic trainer"),
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
    data = tmp_path / "images"
    (data / "train").mkdir(parents=True)
    (data / "val").mkdir()
    cfg = build_config(
        {
            "trainer": "imagefolder",
            "epochs": "3",
            "batch_size": "16",
            "lr": "0.1",
            "seed": "7",
            "data_dir": str(data),
            "resume": str(ckpt),
            "sync_bn": True,
            "init_method": f"file://{tmp_path}/init",
            "model": "resnet50",
            "amp": "bf16",
            "workers": "3",
            "run_dir": str(tmp_path / "run"),
        },
        TWO_GPUS,
        deep=False,  # the checkpoint is not a real one: its header is checked elsewhere
    )
    argv = cfg.trainer_argv()
    joined = " ".join(argv)
    for part in (
        "--epochs 3",
        "--batch-size 16",
        "--lr 0.1",
        "--seed 7",
        f"--data-dir {data}",
        f"--resume {ckpt}",
        "--sync-bn",
        f"--init-method file://{tmp_path}/init",
        "--model resnet50",
        "--amp bf16",
        "--backend nccl",
        "--device cuda",
        "--workers 3",
        f"--checkpoint {tmp_path / 'run' / 'checkpoint.pt'}",
    ):
        assert part in joined
    assert cfg.trainer_module == "trainers.imagefolder"


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


# -- the device and the world size on a faked machine (issue 14 item 1, issue 7 defect 2) -------
NO_GPU = Machine(cuda_devices=0, cuda_reason="no NVIDIA driver loaded", cpu_count=16)
ONE_GPU = Machine(cuda_devices=1, cuda_reason="", cpu_count=16)
FOUR_GPUS = Machine(cuda_devices=4, cuda_reason="", cpu_count=16)


@pytest.mark.parametrize(
    ("machine", "device", "backend", "world_size", "workers"),
    [
        (NO_GPU, "cpu", "gloo", 2, 0),
        (ONE_GPU, "cuda", "nccl", 1, 8),  # 16 cores for one rank: capped at 8
        (FOUR_GPUS, "cuda", "nccl", 4, 4),  # 16 cores / 4 local ranks
    ],
)
def test_default_device_world_size_and_workers(
    tmp_path, machine, device, backend, world_size, workers
):
    cfg = build_config({"run_dir": str(tmp_path / "r")}, machine)
    assert (cfg.device, cfg.backend, cfg.world_size, cfg.workers) == (
        device,
        backend,
        world_size,
        workers,
    )
    assert cfg.trainer_argv()[:4] == ["--backend", backend, "--device", device]
    assert cfg.rank_environment()["DDPTUI_DEVICE"] == device


@pytest.mark.parametrize("backend", ["auto", "nccl", "gloo"])
@pytest.mark.parametrize(("machine", "ranks"), [(ONE_GPU, 2), (FOUR_GPUS, 5)])
def test_more_cuda_ranks_than_gpus_is_refused_whatever_the_backend(
    tmp_path, machine, ranks, backend
):
    with pytest.raises(ConfigError) as info:
        build_config(
            {"world_size": str(ranks), "backend": backend, "run_dir": str(tmp_path)}, machine
        )
    message = str(info.value)
    assert info.value.field == "world_size"
    assert f"more than the {machine.cuda_devices} GPU(s)" in message
    assert "--device cpu" in message


def device_env(cfg):
    """The rank environment but the Flight Recorder's size (tested in test_flight.py) and
    the threads (below)."""
    skip = ("TORCH_FR_BUFFER_SIZE", "DDPTUI_THREADS")
    return {k: v for k, v in cfg.rank_environment().items() if k not in skip}


@pytest.mark.parametrize(
    ("omp", "ddptui", "threads"),
    [
        ("3", None, "3"),  # the user's OMP_NUM_THREADS, as torchrun keeps it
        (" 03 ", None, "3"),
        ("3", "5", None),  # DDPTUI_THREADS wins (the ranks inherit it)
        (None, None, None),  # each rank's share of the cores
        ("0", None, None),
        ("-1", None, None),
        ("1e400", None, None),
        ("4097", None, None),
        ("", None, None),
        ("٣", None, None),  # a digit, but not ASCII
    ],
)
def test_the_users_omp_num_threads_is_each_ranks_threads(
    tmp_path, monkeypatch, omp, ddptui, threads
):
    for name, value in (("OMP_NUM_THREADS", omp), ("DDPTUI_THREADS", ddptui)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    cfg = build_config({"device": "cpu", "run_dir": str(tmp_path)}, FOUR_GPUS)
    assert cfg.rank_environment().get("DDPTUI_THREADS") == threads


def test_device_cpu_on_a_gpu_machine_runs_gloo_cpu_ranks(tmp_path):
    cfg = build_config({"device": "cpu", "world_size": "8", "run_dir": str(tmp_path)}, FOUR_GPUS)
    assert (cfg.device, cfg.backend, cfg.world_size, cfg.workers) == ("cpu", "gloo", 8, 0)
    assert "--device cpu" in " ".join(cfg.trainer_argv())
    assert device_env(cfg) == {"DDPTUI_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    default = build_config({"device": "cpu", "run_dir": str(tmp_path)}, FOUR_GPUS)
    assert default.world_size == 2


def test_device_cpu_does_not_ask_torch(monkeypatch, tmp_path):
    def no(*_):
        raise AssertionError("Machine.detect called for --device cpu")

    monkeypatch.setattr(Machine, "detect", classmethod(no))
    assert build_config({"device": "cpu", "run_dir": str(tmp_path)}).device == "cpu"


@pytest.mark.parametrize(
    ("raw", "machine", "field", "message"),
    [
        ({"device": "cuda"}, NO_GPU, "device", "--device cuda needs a CUDA GPU: no NVIDIA driver"),
        ({"device": "tpu"}, NO_GPU, "device", "unknown device 'tpu' (choose from auto, cpu, cuda)"),
        ({"device": "cpu", "backend": "nccl"}, FOUR_GPUS, "backend", "nccl needs CUDA ranks"),
        ({"device": "cpu", "amp": "fp16"}, FOUR_GPUS, "amp", "AMP fp16 needs CUDA ranks"),
        ({"device": "cpu", "sync_bn": True}, FOUR_GPUS, "sync_bn", "--sync-bn needs CUDA ranks"),
        ({"amp": "fp16"}, NO_GPU, "amp", "AMP fp16 needs a CUDA GPU"),
    ],
)
def test_device_refusals(raw, machine, field, message, tmp_path):
    with pytest.raises(ConfigError) as info:
        build_config({**raw, "run_dir": str(tmp_path)}, machine)
    assert (info.value.field, message in str(info.value)) == (field, True), str(info.value)


def test_fp16_and_sync_bn_fine_on_cuda_ranks(tmp_path):
    cfg = build_config({"amp": "fp16", "sync_bn": True, "run_dir": str(tmp_path)}, ONE_GPU)
    assert (cfg.device, cfg.amp, cfg.sync_bn) == ("cuda", "fp16", True)
    assert device_env(cfg) == {"DDPTUI_DEVICE": "cuda"}


def test_cpu_world_size_is_capped_at_four_ranks_per_usable_core(tmp_path):
    two_cores = Machine(0, "none", cpu_count=2)
    run_dir = str(tmp_path / "r")
    assert build_config({"world_size": "8", "run_dir": run_dir}, two_cores).world_size == 8
    with pytest.raises(ConfigError) as info:
        build_config({"world_size": "9", "run_dir": run_dir}, two_cores)
    assert str(info.value) == (
        "world size 9 is more than 8 ranks for the 2 usable CPU core(s) here (4 per core): "
        "use fewer ranks, or --oversubscribe to start them anyway"
    )
    raw = {"world_size": "9", "oversubscribe": True, "run_dir": run_dir}
    assert build_config(raw, two_cores).world_size == 9
    for huge in ("1025", "100000", "9" * 40):
        with pytest.raises(ConfigError, match="more than the 1024 ranks") as info:
            build_config({**raw, "world_size": huge}, two_cores)
        assert len(str(info.value)) < 200


def test_machine_counts_usable_cores_not_all_cores(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    assert Machine(0, "none").cpu_count == 1


def test_workers(tmp_path):
    raw = {"run_dir": str(tmp_path)}
    assert build_config({**raw, "workers": "0"}, FOUR_GPUS).workers == 0
    assert build_config({**raw, "workers": "64"}, NO_GPU).workers == 64
    for bad, message in (("-1", "at least 0"), ("65", "at most 64"), ("two", "a whole number")):
        with pytest.raises(ConfigError, match=f"--workers must be {message}"):
            build_config({**raw, "workers": bad}, NO_GPU)
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    with pytest.raises(ConfigError, match="--workers is an option of the trainers"):
        build_config({**raw, "script": str(script), "workers": "2"}, NO_GPU)


# -- values refused before launch (issue 7 defect 3, issue 12 item 5) ------------------------------
@pytest.mark.parametrize(
    ("raw", "field", "message"),
    [
        ({"epochs": "1000001"}, "epochs", "--epochs must be at most 1000000"),
        ({"epochs": "9" * 5000}, "epochs", "whole number"),  # beyond int()'s digit limit
        ({"seed": "-1"}, "seed", "--seed must be at least 0"),
        ({"seed": str(2**32)}, "seed", "--seed must be at most 4294967295"),
        ({"seed": str(2**64)}, "seed", "--seed must be at most"),
        ({"lr": "inf"}, "lr", "--lr must be a finite number, got 'inf'"),
        ({"lr": "1e400"}, "lr", "--lr must be a finite number, got '1e400'"),
        ({"lr": "nan"}, "lr", "--lr must be a finite number, got 'nan'"),
        ({"lr": "-0.1"}, "lr", "--lr must be greater than 0"),
        ({"batch_size": str(2**20 + 1)}, "batch_size", "--batch-size must be at most 1048576"),
        ({"world_size": "1e3"}, "world_size", "whole number"),
        ({"trainer": "x" * 10_000}, "trainer", "unknown trainer 'xxxx"),
        ({"model": "nonsense"}, "model", "unknown model 'nonsense' for the synthetic trainer"),
        ({"run_dir": "runs/a\x00b"}, "run_dir", "--run-dir contains a NUL byte"),
        ({"run_dir": "r/" + "a" * 256}, "run_dir", "--run-dir has a name longer than 255 bytes"),
        ({"run_dir": "a/" * 2100}, "run_dir", "--run-dir is longer than 4095 bytes"),
        ({"run_dir": "\ud800"}, "run_dir", "has characters no file name can hold"),
        ({"resume": "c\x00.pt"}, "resume", "--resume contains a NUL byte"),
        ({"resume": "a" * 300 + ".pt"}, "resume", "--resume has a name longer than 255"),
        ({"script": "t\x00.py"}, "script", "--script contains a NUL byte"),
        ({"data_dir": "d\x00"}, "data_dir", "--data-dir contains a NUL byte"),
    ],
)
def test_hostile_values_are_one_line_errors(raw, field, message, tmp_path):
    raw = {"run_dir": str(tmp_path / "r"), **raw}
    with pytest.raises(ConfigError) as info:
        build_config(raw, CPU)
    text = str(info.value)
    assert info.value.field == field and message in text, text
    assert "\n" not in text and len(text) < 300


def test_unicode_run_directory_is_fine(tmp_path):
    cfg = build_config({"run_dir": str(tmp_path / "rüns ✓" / "日本")}, CPU)
    assert cfg.run_dir.endswith("日本")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("tcp://127.0.0.1:99999", "the port must be a number from 1 to 65535"),
        ("tcp://127.0.0.1:http", "the port must be a number"),
        ("tcp://", "has no host"),
        ("tcp://:29500", "has no host"),
        ("tcp://127.0.0.1", "needs a port from 1 to 65535"),
        ("tcp://127.0.0.1:0", "needs a port from 1 to 65535"),
        ("tcp://h:1/x", "has a path"),
        ("tcp://h :1", "--init-method must be"),
        ("file:///no/such/dir/init", "directory /no/such/dir does not exist"),
        ("file://relative/init", "needs an absolute path"),
        ("file://", "needs an absolute path"),
        ("env://x", "env:// takes nothing after it"),
        ("udp://h:1", "--init-method must be"),
    ],
)
def test_bad_init_methods(url, message, tmp_path):
    with pytest.raises(ConfigError) as info:
        build_config({"init_method": url, "run_dir": str(tmp_path / "r")}, CPU)
    assert info.value.field == "init_method" and message in str(info.value), str(info.value)


def test_good_init_methods_and_a_stale_init_file(tmp_path):
    raw = {"run_dir": str(tmp_path / "r")}
    for url in ("tcp://127.0.0.1:29500", "tcp://[::1]:1", f"file://{tmp_path}/init", "env://"):
        assert build_config({**raw, "init_method": url}, CPU).init_method == url
    (tmp_path / "init").write_text("left over")
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        build_config({**raw, "init_method": f"file://{tmp_path}/init"}, CPU)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("train.txt", b"print(1)\n", "script must be a Python file ending in .py"),
        ("bin.py", b"\x7fELF\x02\x01\x00\x00", "is not Python: it holds binary data"),
        ("latin.py", b"x = '\xe9'\n", "is not Python text: it is not valid UTF-8"),
        ("bad.py", b"def f(:\n", "is not valid Python: line 1:"),
    ],
)
def test_scripts_that_are_not_python(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ConfigError) as info:
        build_config({"script": str(tmp_path / name), "run_dir": str(tmp_path / "r")}, CPU)
    assert info.value.field == "script" and message in str(info.value), str(info.value)


def test_python_scripts_pass(tmp_path):
    (tmp_path / "empty.py").write_bytes(b"")
    (tmp_path / "latin1.py").write_bytes(b"# -*- coding: latin-1 -*-\nx = '\xe9'\n")
    (tmp_path / "dir.py").mkdir()
    raw = {"run_dir": str(tmp_path / "r")}
    for name in ("empty.py", "latin1.py"):
        assert build_config({**raw, "script": str(tmp_path / name)}, CPU).script
    with pytest.raises(ConfigError, match="--script names a directory, not a file"):
        build_config({**raw, "script": str(tmp_path / "dir.py")}, CPU)


# -- the checkpoint given to --resume: its header, read before launch --------------------------
def _checkpoint(path, trainer="synthetic", model="smallcnn", weights=None, **extra):
    """A trainer checkpoint; ``weights`` replaces its model state_dict, ``extra`` its keys."""
    import torch

    state = {
        "epoch": 2,
        "config": {"trainer": trainer, "model": model},
        "model": {"fc.weight": torch.zeros(2, 2)} if weights is None else weights,
        "optimizer": {"state": {}, "param_groups": []},
        **extra,
    }
    torch.save(state, path)
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_bytes(b""), "is an empty file, not a checkpoint"),
        (lambda p: p.write_bytes(b"\x89garbage" * 50), "is not a checkpoint (not a torch.save"),
        (lambda p: __import__("torch").save([1, 2], p), "is not a trainer checkpoint"),
        (
            lambda p: __import__("torch").save({"epoch": "x", "config": {}, "model": {}}, p),
            "its config or epoch is malformed",
        ),
        (lambda p: _checkpoint(p, trainer="mnist"), "was saved by the 'mnist' trainer, not"),
        (lambda p: _checkpoint(p, model="resnet18"), "holds a 'resnet18' model, but this run"),
        (lambda p: _checkpoint(p, epoch=10**30), "its epoch 10000000… (31 digits) is not in"),
        (lambda p: _checkpoint(p, epoch=-1), "its epoch -1 is not in 0..1000000"),
        (lambda p: _checkpoint(p, weights={}), "it holds no model weights"),
        (lambda p: _checkpoint(p, weights={"w": 1.0}), "not a state_dict of named tensors"),
        (lambda p: _checkpoint(p, optimizer=None), "it holds no optimizer state"),
        (lambda p: _checkpoint(p, partial={"epoch": "x"}), "record of a stopped epoch"),
    ],
)
def test_resume_header_is_checked_before_launch(tmp_path, make, message):
    make(tmp_path / "c.pt")
    with pytest.raises(ConfigError) as info:
        build_config({"resume": str(tmp_path / "c.pt"), "run_dir": str(tmp_path / "r")}, CPU)
    assert info.value.field == "resume" and message in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_resume_of_a_matching_checkpoint_and_a_model_hint(tmp_path):
    raw = {"resume": str(_checkpoint(tmp_path / "ok.pt")), "run_dir": str(tmp_path / "r")}
    assert build_config(raw, CPU).resume == str(tmp_path / "ok.pt")
    data = tmp_path / "images"
    (data / "train").mkdir(parents=True)
    (data / "val").mkdir()
    ckpt = _checkpoint(tmp_path / "r50.pt", trainer="imagefolder", model="resnet50")
    raw = {"trainer": "imagefolder", "data_dir": str(data), "resume": str(ckpt)}
    with pytest.raises(ConfigError, match=r"trains 'resnet18' \(pass --model resnet50\)"):
        build_config({**raw, "run_dir": str(tmp_path / "r")}, CPU)
    assert build_config({**raw, "model": "resnet50", "run_dir": str(tmp_path / "r")}, CPU).resume


# -- arguments after -- checked with the trainer's own parser ----------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--epochs", "x"), "the synthetic trainer refuses its arguments: argument --epochs"),
        (("--no-such-flag",), "unrecognized arguments: --no-such-flag"),
        (("--model", "resnet50"), "argument --model: invalid choice"),
        (("--help",), "make it exit without training"),
    ],
)
def test_trainer_arguments_are_parsed_before_launch(tmp_path, args, message, capsys):
    with pytest.raises(ConfigError) as info:
        build_config({"script_args": args, "run_dir": str(tmp_path)}, CPU)
    assert info.value.field == "script_args" and message in str(info.value), str(info.value)
    assert capsys.readouterr() == ("", "")  # argparse's usage text went nowhere


def test_trainer_arguments_it_accepts(tmp_path):
    cfg = build_config({"script_args": ("--train-size", "64"), "run_dir": str(tmp_path)}, CPU)
    assert cfg.trainer_argv()[-2:] == ["--train-size", "64"]
    # deep=False (the form, on every key) leaves them for the launch
    build_config({"script_args": ("--bogus",), "run_dir": str(tmp_path)}, CPU, deep=False)
