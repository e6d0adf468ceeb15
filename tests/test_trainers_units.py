"""Trainer pieces without a process group: registry, options, rank context, sharding."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
import torch

from trainers import DEFAULT_TRAINER, TRAINERS
from trainers.checkpoint import pid_alive, remove_stale_temps
from trainers.datasets import synthetic_images
from trainers.distributed import context_from_env, shard_indices
from trainers.loop import autocast, resolve_device
from trainers.options import TrainConfig, build_parser, parse_config


def test_registry_names_importable_trainers():
    assert DEFAULT_TRAINER in TRAINERS
    assert set(TRAINERS) == {"synthetic", "mnist", "cifar10", "imagefolder"}
    for name, module_path in TRAINERS.items():
        module = importlib.import_module(module_path)
        assert callable(module.main), name


def test_registry_import_does_not_import_torch():
    code = "import sys, trainers; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("size", "rank", "world_size", "expected"),
    [
        (7, 0, 3, [0, 3, 6]),
        (7, 1, 3, [1, 4]),
        (7, 2, 3, [2, 5]),
        (2, 2, 3, []),  # fewer samples than ranks: this rank gets nothing
        (0, 0, 1, []),
        (5, 0, 1, [0, 1, 2, 3, 4]),
    ],
)
def test_shard_indices_rows(size, rank, world_size, expected):
    assert list(shard_indices(size, rank, world_size)) == expected


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 8])
def test_shard_indices_cover_every_index_exactly_once(world_size):
    for size in [*range(0, 20), 1001, 1024]:
        shards = [list(shard_indices(size, rank, world_size)) for rank in range(world_size)]
        assert sorted(i for shard in shards for i in shard) == list(range(size))
        assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_shard_indices_rejects_bad_rank():
    with pytest.raises(ValueError):
        shard_indices(10, 2, 2)


def test_context_standalone_is_world_of_one_on_a_free_port():
    ctx = context_from_env(None, environ={})
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size) == (0, 0, 1, 1)
    assert not ctx.launched and ctx.is_main
    assert ctx.init_method.startswith("tcp://127.0.0.1:")
    assert int(ctx.init_method.rsplit(":", 1)[1]) > 0


def test_context_under_torchrun_uses_env_rendezvous():
    env = {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    ctx = context_from_env(None, environ=env)
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size) == (3, 1, 4, 2)
    assert ctx.init_method == "env://" and ctx.launched and not ctx.is_main


def test_context_init_method_argument_wins():
    env = {"RANK": "0", "WORLD_SIZE": "2"}
    ctx = context_from_env("tcp://127.0.0.1:1234", environ=env)
    assert ctx.init_method == "tcp://127.0.0.1:1234"
    assert (ctx.local_rank, ctx.local_world_size) == (0, 2)


def test_context_rejects_rank_outside_world():
    with pytest.raises(ValueError, match="outside WORLD_SIZE"):
        context_from_env(None, environ={"RANK": "2", "WORLD_SIZE": "2"})


def _parser(**overrides):
    kwargs = dict(description=None, epochs=3, batch_size=32, lr=0.1, models=["a", "b"])
    kwargs.update(overrides)
    return build_parser("synthetic", **kwargs)


def test_parse_config_defaults():
    config = parse_config(_parser(train_size=100, test_size=11), ["--device", "cpu"])
    assert config == TrainConfig(
        trainer="synthetic",
        model="a",
        epochs=3,
        batch_size=32,
        lr=0.1,
        seed=0,
        backend="gloo",
        device="cpu",
        amp="off",
        data_dir="data",
        workers=None,
        data_on_device="auto",
        train_size=100,
        test_size=11,
    )


def test_parse_config_common_flags():
    argv = [
        "--device",
        "cpu",
        "--backend",
        "gloo",
        "--amp",
        "bf16",
        "--epochs",
        "5",
        "--batch-size",
        "8",
        "--lr",
        "0.5",
        "--seed",
        "7",
        "--data-dir",
        "/d",
        "--checkpoint",
        "/c.pt",
        "--resume",
        "/r.pt",
        "--init-method",
        "file:///tmp/x",
        "--sync-bn",
        "--model",
        "b",
        "--workers",
        "2",
        "--train-size",
        "9",
        "--test-size",
        "4",
    ]
    config = parse_config(_parser(), argv)
    assert (config.amp, config.epochs, config.batch_size, config.lr, config.seed) == (
        "bf16",
        5,
        8,
        0.5,
        7,
    )
    assert (config.data_dir, config.checkpoint, config.resume, config.init_method) == (
        "/d",
        "/c.pt",
        "/r.pt",
        "file:///tmp/x",
    )
    assert config.sync_bn and config.model == "b" and config.workers == 2
    assert (config.train_size, config.test_size) == (9, 4)


@pytest.mark.parametrize(
    ("cuda", "argv", "device", "backend"),
    [
        (True, [], "cuda", "nccl"),
        (False, [], "cpu", "gloo"),
        (True, ["--device", "cpu"], "cpu", "gloo"),
        (True, ["--backend", "gloo"], "cuda", "gloo"),
        (False, ["--device", "cuda"], "cuda", "nccl"),  # refused later, by resolve_device
    ],
)
def test_parse_config_resolves_device_and_backend(monkeypatch, cuda, argv, device, backend):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    config = parse_config(_parser(), argv)
    assert (config.device, config.backend) == (device, backend)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epochs", "0"], "argument --epochs: must be at least 1, got 0"),
        (["--epochs", "10000000"], "argument --epochs: must be at most 1000000, got 10000000"),
        (["--epochs", "1e9"], "argument --epochs: invalid epochs value: '1e9'"),
        (["--batch-size", "-1"], "argument --batch-size: must be at least 1, got -1"),
        (["--lr", "0"], "argument --lr: must be a positive finite number, got 0"),
        (["--lr", "inf"], "argument --lr: must be a positive finite number, got inf"),
        (["--lr", "1e400"], "argument --lr: must be a positive finite number, got 1e400"),
        (["--lr", "nan"], "argument --lr: must be a positive finite number, got nan"),
        (["--seed", "-1"], "argument --seed: must be at least 0, got -1"),
        (["--seed", "9" * 30], "argument --seed: must be at most 4294967295, got 999"),
        (["--amp", "fp8"], "argument --amp: invalid choice: 'fp8'"),
        (["--backend", "mpi"], "argument --backend: invalid choice: 'mpi'"),
        (["--model", "c"], "argument --model: invalid choice: 'c'"),
        (["--workers", "-1"], "argument --workers: must be at least 0, got -1"),
        (["--workers", "100000"], "argument --workers: must be at most 256, got 100000"),
        (["--workers", "two"], "argument --workers: invalid workers value: 'two'"),
    ],
)
def test_parse_config_rejects_bad_values_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as caught:
        parse_config(_parser(), argv)
    assert caught.value.code == 2  # argparse's usage error
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"python -m trainers.synthetic: error: {message}")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"backend": "nccl"}, "nccl backend needs CUDA"),
        ({"amp": "fp16"}, "fp16 needs CUDA"),
        ({"sync_bn": True}, "sync-bn needs CUDA"),
    ],
)
def test_resolve_device_refuses_what_cpu_cannot_run(overrides, message):
    config = TrainConfig(
        trainer="synthetic", model="a", epochs=1, batch_size=1, lr=1.0, device="cpu", **overrides
    )
    with pytest.raises(ValueError, match=message):
        resolve_device(config, context_from_env(None, environ={}))


def test_autocast_fp16_on_cpu_is_refused():
    with pytest.raises(ValueError, match="fp16 needs CUDA"):
        autocast(torch.device("cpu"), "fp16")


def test_synthetic_data_is_deterministic_and_splits_differ():
    a, b = synthetic_images(50, seed=1, train=True), synthetic_images(50, seed=1, train=True)
    assert torch.equal(a.tensors[0], b.tensors[0]) and torch.equal(a.tensors[1], b.tensors[1])
    test = synthetic_images(50, seed=1, train=False)
    assert not torch.equal(a.tensors[0], test.tensors[0])
    other = synthetic_images(50, seed=2, train=True)
    assert not torch.equal(a.tensors[0], other.tensors[0])
    assert a.tensors[0].shape == (50, 1, 16, 16) and a.tensors[1].max() < 10


def test_remove_stale_temps_only_touches_dead_writers_of_this_checkpoint(tmp_path):
    checkpoint = tmp_path / "ckpt.pt"
    parent_pid = os.getppid()  # alive: a concurrent writer
    names = {
        f".ckpt.pt.{parent_pid}.tmp": True,  # kept: its writer is alive
        f".ckpt.pt.{os.getpid()}.tmp": False,  # this process has not written yet: stale
        ".ckpt.pt.0.tmp": False,  # no process has pid 0
        f".ckpt.pt.{2**22 + 12345}.tmp": False,  # above any pid_max: gone
        ".ckpt.pt.99999999999.tmp": True,  # not a pid at all: not our pattern
        ".ckpt.pt.-5.tmp": True,
        ".ckpt.pt..tmp": True,
        ".other.pt.0.tmp": True,
        "ckpt.pt.0.tmp": True,
        "ckpt.pt": True,
    }
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "victim").write_bytes(b"keep me")
    link = tmp_path / ".ckpt.pt.1.tmp"  # pid 1 is alive anyway; a link is never followed
    link.symlink_to(tmp_path / "elsewhere" / "victim")
    removed = remove_stale_temps(checkpoint)
    assert sorted(p.name for p in removed) == sorted(n for n, keep in names.items() if not keep)
    assert {p.name for p in tmp_path.iterdir()} == {
        *(n for n, keep in names.items() if keep),
        "elsewhere",
        ".ckpt.pt.1.tmp",
    }
    assert (tmp_path / "elsewhere" / "victim").read_bytes() == b"keep me"
    assert remove_stale_temps(tmp_path / "missing" / "ckpt.pt") == []


@pytest.mark.parametrize(("pid", "alive"), [(0, False), (-1, False), (2**40, False), (1, True)])
def test_pid_alive(pid, alive):
    assert pid_alive(pid) is alive
    assert pid_alive(os.getpid())
