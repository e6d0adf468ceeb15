"""Each trainer's ``main`` end to end, in this process (a real world-of-one gloo group).

Data comes from tiny files in the real formats (see ``tests/trainer_data.py``), read by
torchvision's own loaders.
"""

from __future__ import annotations

import copy
import math
import os
import pickle
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import ddptui
from tests.trainer_data import clean_env, write_cifar10, write_imagefolder, write_mnist
from trainers import cifar10, imagefolder, mnist, synthetic
from trainers.checkpoint import temp_path
from trainers.datasets import DatasetError, DatasetNotFoundError, cifar10_splits
from trainers.loop import CheckpointError, Trainer

CPU = ["--device", "cpu", "--backend", "gloo"]
TINY = [*CPU, "--epochs", "1", "--train-size", "64", "--test-size", "37", "--batch-size", "16"]


@pytest.fixture(autouse=True)
def _standalone(monkeypatch):
    clean_env(monkeypatch)
    yield
    assert not dist.is_initialized(), "main() must destroy its process group"


def _epoch_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("epoch ")]


def test_synthetic_main_runs_one_epoch(capsys):
    assert synthetic.main(TINY) == 0
    [line] = _epoch_lines(capsys.readouterr().out)
    assert line.startswith("epoch 1/1 loss ") and "(37 samples)" in line


def test_synthetic_reports_every_step_and_the_evaluation(monkeypatch):
    calls: list[tuple[str, dict]] = []
    for name in ("log", "log_eval", "started", "finished"):
        monkeypatch.setattr(ddptui, name, lambda _n=name, **kw: calls.append((_n, kw)))
    synthetic.main([*TINY, "--epochs", "2"])
    kinds = [name for name, _ in calls]
    assert kinds[0] == "started" and kinds[-1] == "finished"
    assert calls[0][1] == {"device": "cpu", "device_uuid": None, "epochs": 2}
    assert calls[-1][1] == {}
    steps = [kw for name, kw in calls if name == "log"]
    assert {kw["epoch"] for kw in steps} == {1, 2}
    for epoch in (1, 2):
        assert sum(kw["samples"] for kw in steps if kw["epoch"] == epoch) == 64
    # The loss is handed over as a 0-dim tensor (reading it would wait for the device).
    assert all(isinstance(kw["loss"], torch.Tensor) for kw in steps)
    assert all(kw["loss"].dim() == 0 and not kw["loss"].requires_grad for kw in steps)
    evals = [kw for name, kw in calls if name == "log_eval"]
    assert [(kw["epoch"], kw["count"]) for kw in evals] == [(1, 37), (2, 37)]


def test_failure_is_reported_and_reraised(monkeypatch, tmp_path):
    finished: list[str | None] = []
    monkeypatch.setattr(ddptui, "finished", lambda error=None: finished.append(error))
    with pytest.raises(DatasetNotFoundError):
        mnist.main([*CPU, "--data-dir", str(tmp_path)])
    assert finished and finished[0].startswith("DatasetNotFoundError: MNIST not found in ")


def test_mnist_main_reads_idx_files(tmp_path, capsys):
    write_mnist(tmp_path, train=40, test=11)
    argv = [*CPU, "--epochs", "1", "--batch-size", "16", "--data-dir", str(tmp_path)]
    assert mnist.main(argv) == 0
    [line] = _epoch_lines(capsys.readouterr().out)
    assert "(11 samples)" in line


def _spy_on_layout(monkeypatch) -> list[tuple[bool, bool]]:
    """(first convolution's weight is channels_last, cudnn.benchmark) as each epoch begins."""
    seen: list[tuple[bool, bool]] = []
    original = Trainer._run_epoch

    def spy(self, epoch):
        conv = next(m for m in self.model.module.modules() if isinstance(m, torch.nn.Conv2d))
        channels_last = conv.weight.is_contiguous(memory_format=torch.channels_last)
        seen.append((channels_last, torch.backends.cudnn.benchmark))
        return original(self, epoch)

    monkeypatch.setattr(Trainer, "_run_epoch", spy)
    return seen


@pytest.mark.slow
def test_cifar10_main_reads_pickle_batches(tmp_path, monkeypatch, capsys):
    write_cifar10(tmp_path, per_batch=2, test=5)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    layouts = _spy_on_layout(monkeypatch)
    argv = [
        *CPU,
        "--epochs",
        "1",
        "--batch-size",
        "5",
        "--lr",
        "0.01",
        "--data-dir",
        str(tmp_path),
        "--no-verify",
    ]
    assert cifar10.main(argv) == 0
    [line] = _epoch_lines(capsys.readouterr().out)
    assert "(5 samples)" in line
    assert layouts == [(False, False)]  # channels_last and cuDNN autotuning: CUDA only


def test_cifar10_checks_md5_by_default(tmp_path):
    write_cifar10(tmp_path, per_batch=2, test=5)
    with pytest.raises(DatasetError, match="md5") as caught:
        cifar10.main([*CPU, "--epochs", "1", "--data-dir", str(tmp_path)])
    assert str(tmp_path) in str(caught.value) and "--no-verify" in str(caught.value)


@pytest.mark.slow
def test_imagefolder_main_reads_pngs(tmp_path, capsys):
    write_imagefolder(tmp_path, train=2, val=1)
    # 6 training images in batches of 3: ResNet's BatchNorm cannot train on a batch of
    # one 1x1 feature map, which a 16px image becomes.
    argv = [
        *CPU,
        "--epochs",
        "1",
        "--batch-size",
        "3",
        "--lr",
        "0.01",
        "--data-dir",
        str(tmp_path),
        "--image-size",
        "16",
    ]
    assert imagefolder.main(argv) == 0
    [line] = _epoch_lines(capsys.readouterr().out)
    assert "(3 samples)" in line


@pytest.mark.parametrize(
    ("trainer", "expected"),
    [
        (mnist, "MNIST/raw/train-images-idx3-ubyte"),
        (cifar10, "cifar-10-batches-py/data_batch_1"),
        (imagefolder, "no train/ directory"),
    ],
)
def test_missing_data_names_the_directory(trainer, expected, tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DatasetNotFoundError) as caught:
        trainer.main([*CPU, "--data-dir", str(missing)])
    assert str(missing) in str(caught.value) and expected in str(caught.value)


def test_imagefolder_without_val_split(tmp_path):
    write_imagefolder(tmp_path)
    for path in sorted((tmp_path / "val").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (tmp_path / "val").rmdir()
    with pytest.raises(DatasetNotFoundError, match="no val/ directory"):
        imagefolder.main([*CPU, "--data-dir", str(tmp_path)])


def test_failed_download_is_a_clear_error(tmp_path, monkeypatch):
    # imported here: torchvision costs every xdist worker a second of collection otherwise
    from torchvision import datasets as tv_datasets

    monkeypatch.setattr(tv_datasets.MNIST, "mirrors", [])  # offline: nothing to try
    with pytest.raises(DatasetNotFoundError, match="downloading MNIST into .* failed"):
        mnist.main([*CPU, "--data-dir", str(tmp_path), "--download"])


def _record_training(monkeypatch) -> tuple[list[float], list[dict]]:
    """Capture each step's loss and each evaluation that the trainer reports."""
    losses: list[float] = []
    evals: list[dict] = []
    monkeypatch.setattr(ddptui, "log", lambda **kw: losses.append(float(kw["loss"])))
    monkeypatch.setattr(ddptui, "log_eval", lambda **kw: evals.append(kw))
    return losses, evals


@pytest.mark.slow
def test_bf16_on_cpu_trains(monkeypatch):
    argv = [*CPU, "--epochs", "2", "--train-size", "512", "--test-size", "101"]
    losses, evals = _record_training(monkeypatch)
    assert synthetic.main([*argv, "--amp", "bf16"]) == 0
    assert len(losses) == 2 * 512 // 32
    assert sum(losses[-4:]) < 0.5 * sum(losses[:4])  # the training loss fell
    assert [e["epoch"] for e in evals] == [1, 2]
    assert evals[1]["loss"] < evals[0]["loss"]
    assert evals[1]["accuracy"] > 0.6  # ten classes: chance is 0.1
    bf16 = [*losses]
    losses.clear()
    assert synthetic.main(argv) == 0
    assert losses != bf16  # autocast was on: float32 takes other steps


@pytest.mark.slow
def test_data_on_device_on_cpu_trains_exactly_like_the_dataloader(tmp_path):
    """Same sampler order, same normalisation, no augmentation: identical weights."""
    saved = {}
    for choice in ("off", "on"):
        checkpoint = tmp_path / f"{choice}.pt"
        argv = [*TINY, "--epochs", "2", "--data-on-device", choice, "--checkpoint", str(checkpoint)]
        assert synthetic.main(argv) == 0
        saved[choice] = torch.load(checkpoint, weights_only=True)["model"]
    for name, tensor in saved["off"].items():
        assert torch.equal(saved["on"][name], tensor), name


@pytest.mark.slow
def test_cifar10_data_on_device_augments_and_trains(tmp_path, monkeypatch, capsys):
    write_cifar10(tmp_path, per_batch=4, test=6)
    losses, evals = _record_training(monkeypatch)
    argv = [*CPU, "--epochs", "1", "--batch-size", "5", "--lr", "0.01", "--no-verify"]
    argv += ["--data-dir", str(tmp_path), "--data-on-device", "on"]
    assert cifar10.main(argv) == 0
    assert "data: held on cpu, batches prepared there" in capsys.readouterr().out
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)
    assert [(e["epoch"], e["count"]) for e in evals] == [(1, 6)]


def test_image_folder_has_no_in_memory_path(capsys):
    with pytest.raises(SystemExit) as caught:
        imagefolder.main([*CPU, "--data-on-device", "on"])
    assert caught.value.code == 2
    assert "unrecognized arguments: --data-on-device on" in capsys.readouterr().err


def test_cifar10_datasets_pickle_for_dataloader_workers(tmp_path):
    """Workers started with ``spawn`` receive the dataset pickled: --no-verify's class too."""
    write_cifar10(tmp_path, per_batch=2, test=3)
    data = cifar10_splits(tmp_path, verify=False)
    for dataset in (data.train, data.test):
        copied = pickle.loads(pickle.dumps(dataset))
        assert type(copied) is type(dataset) and len(copied) == len(dataset)
    test_copy = pickle.loads(pickle.dumps(data.test))  # not augmented: the same tensors
    assert torch.equal(test_copy[2][0], data.test[2][0])


def _spy_on_epochs(monkeypatch) -> list[tuple[int, dict, dict]]:
    """Record (epoch, model state, optimizer state) as each training epoch begins."""
    seen: list[tuple[int, dict, dict]] = []
    original = Trainer._run_epoch

    def spy(self, epoch):
        model = {k: v.clone() for k, v in self.model.module.state_dict().items()}
        seen.append((epoch, model, copy.deepcopy(self.optimizer.state_dict())))
        return original(self, epoch)

    monkeypatch.setattr(Trainer, "_run_epoch", spy)
    return seen


@pytest.mark.slow
def test_resume_continues_from_the_checkpoint(tmp_path, monkeypatch, capsys):
    checkpoint = tmp_path / "ckpt" / "model.pt"
    assert synthetic.main([*TINY, "--checkpoint", str(checkpoint)]) == 0
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["epoch"] == 1 and saved["scaler"] is None
    assert saved["config"]["trainer"] == "synthetic" and saved["config"]["epochs"] == 1
    capsys.readouterr()

    seen = _spy_on_epochs(monkeypatch)
    argv = [*TINY, "--epochs", "2", "--resume", str(checkpoint), "--checkpoint", str(checkpoint)]
    assert synthetic.main(argv) == 0
    assert [epoch for epoch, _, _ in seen] == [2]
    _, model_state, optimizer_state = seen[0]
    assert model_state.keys() == saved["model"].keys()
    for name, tensor in saved["model"].items():
        assert torch.equal(model_state[name], tensor), name
    assert optimizer_state["state"][0]["step"] == saved["optimizer"]["state"][0]["step"]
    assert _epoch_lines(capsys.readouterr().out)[0].startswith("epoch 2/2 ")
    assert torch.load(checkpoint, weights_only=True)["epoch"] == 2
    assert [p.name for p in checkpoint.parent.iterdir()] == ["model.pt"]  # no temp files


def test_resume_after_the_last_epoch_only_evaluates(tmp_path, monkeypatch, capsys):
    checkpoint = tmp_path / "model.pt"
    synthetic.main([*TINY, "--checkpoint", str(checkpoint)])
    first = _epoch_lines(capsys.readouterr().out)[0]
    seen = _spy_on_epochs(monkeypatch)
    assert synthetic.main([*TINY, "--resume", str(checkpoint)]) == 0
    assert seen == []
    again = _epoch_lines(capsys.readouterr().out)[0]
    assert again.split()[:6] == first.split()[:6]  # same weights, same loss and accuracy


@pytest.mark.slow
def test_failed_save_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    checkpoint = tmp_path / "model.pt"
    synthetic.main([*TINY, "--checkpoint", str(checkpoint)])
    before = checkpoint.read_bytes()

    def broken_save(obj, file):
        file.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        synthetic.main([*TINY, "--checkpoint", str(checkpoint)])
    assert checkpoint.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_checkpoint_temp_files_are_removed_at_start(tmp_path, capsys):
    checkpoint = tmp_path / "model.pt"
    dead = temp_path(checkpoint, _dead_pid())
    live = temp_path(checkpoint, os.getppid())  # a concurrent writer: keep its file
    own = temp_path(checkpoint, os.getpid())  # this process has not saved yet: stale
    others = [
        tmp_path / f".model.pt.{_dead_pid()}.tmp.keep",
        tmp_path / f".other.pt.{_dead_pid()}.tmp",
        tmp_path / ".model.pt.x1.tmp",
    ]
    for path in (dead, live, own, *others):
        path.write_bytes(b"partial")
    assert synthetic.main([*TINY, "--checkpoint", str(checkpoint)]) == 0
    assert not dead.exists() and not own.exists()
    assert live.exists() and all(path.exists() for path in others)
    assert f"removed {dead}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "does not exist"), (b"not a checkpoint", "not a readable checkpoint")],
)
def test_unreadable_resume_file(tmp_path, content, message):
    path = tmp_path / "bad.pt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CheckpointError, match=message):
        synthetic.main([*TINY, "--resume", str(path)])


def test_resume_from_another_trainer_is_refused(tmp_path, capsys):
    write_mnist(tmp_path, train=16, test=4)
    checkpoint = tmp_path / "mnist.pt"
    mnist.main(
        [*CPU, "--epochs", "1", "--data-dir", str(tmp_path), "--checkpoint", str(checkpoint)]
    )
    with pytest.raises(CheckpointError, match="saved by the 'mnist' trainer"):
        synthetic.main([*TINY, "--resume", str(checkpoint)])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("amp", ["off", "fp16", "bf16"])
def test_synthetic_on_cuda_with_nccl(amp, tmp_path, capsys):
    checkpoint = tmp_path / "model.pt"
    argv = [
        "--device",
        "cuda",
        "--backend",
        "nccl",
        "--amp",
        amp,
        "--epochs",
        "1",
        "--train-size",
        "256",
        "--test-size",
        "101",
        "--checkpoint",
        str(checkpoint),
    ]
    assert synthetic.main(argv) == 0
    assert "(101 samples)" in _epoch_lines(capsys.readouterr().out)[0]
    saved = torch.load(checkpoint, weights_only=True, map_location="cpu")
    assert (saved["scaler"] is not None) == (amp == "fp16")
    argv = [*argv[:-2], "--epochs", "2", "--resume", str(checkpoint)]
    assert synthetic.main(argv) == 0


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _cuda_cifar10_argv(data_dir, amp: str, placement: str, epochs: int = 1) -> list[str]:
    argv = ["--device", "cuda", "--backend", "nccl", "--amp", amp, "--epochs", str(epochs)]
    argv += ["--batch-size", "8", "--lr", "0.01", "--no-verify", "--data-dir", str(data_dir)]
    return [*argv, "--data-on-device", placement, "--workers", "2"]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("placement", ["on", "off"])
@pytest.mark.parametrize("amp", ["off", "fp16", "bf16"])
def test_cifar10_on_cuda_with_nccl(amp, placement, tmp_path, monkeypatch, capsys):
    write_cifar10(tmp_path, per_batch=8, test=8)
    losses: list[torch.Tensor] = []
    monkeypatch.setattr(ddptui, "log", lambda **kw: losses.append(kw["loss"]))
    layouts = _spy_on_layout(monkeypatch)
    assert cifar10.main(_cuda_cifar10_argv(tmp_path, amp, placement)) == 0
    out = capsys.readouterr().out
    if placement == "on":
        assert "data: held on cuda:0, batches prepared there, channels_last" in out
    else:
        assert "data: DataLoader, 2 workers, pinned, channels_last" in out
    assert "(8 samples)" in _epoch_lines(out)[0]
    assert layouts == [(True, True)]
    assert len(losses) == 5  # 40 images in batches of 8
    assert all(loss.device.type == "cuda" and loss.dim() == 0 for loss in losses)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("placement", ["on", "off"])
@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_training_steps_never_wait_for_the_gpu(amp, placement, tmp_path, monkeypatch):
    """Any synchronising CUDA call during a training epoch raises (after a warm-up epoch).

    fp16 is left out: GradScaler.step reads its inf/nan check on the host every step.
    """
    write_cifar10(tmp_path, per_batch=8, test=8)
    original = Trainer._run_epoch
    strict_epochs = []

    def strict(self, epoch):
        if epoch == 1:  # warm-up: cuDNN autotuning, DDP's first buckets
            return original(self, epoch)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            original(self, epoch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        strict_epochs.append(epoch)

    monkeypatch.setattr(Trainer, "_run_epoch", strict)
    assert cifar10.main(_cuda_cifar10_argv(tmp_path, amp, placement, epochs=2)) == 0
    assert strict_epochs == [2]
