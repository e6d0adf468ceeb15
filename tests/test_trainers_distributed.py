"""Real multi-process gloo groups: distributed evaluation, a two-rank training run, and the
built-in trainers with DataLoader workers under both of ddptui's launchers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

import pytest
import torch
import torch.multiprocessing as mp

from ddptui.constants import ENDPOINT_ENV, RUN_ID_ENV, THREADS_ENV
from ddptui.rank.net import free_port
from tests.helpers import processes_of_run
from tests.trainer_data import (
    bn_model,
    clean_env,
    eval_worker,
    write_cifar10,
    write_imagefolder,
)
from trainers.batches import Feed, eval_batches
from trainers.datasets import synthetic_splits
from trainers.loop import evaluate

# Not divisible by 2 or 3, and one smaller than the world (a rank with no samples).
SIZES = [11, 7, 2]


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_distributed_eval_equals_single_process(world_size, tmp_path):
    torch.manual_seed(0)
    model = bn_model()
    with torch.no_grad():  # non-trivial running stats, so buffers matter
        bn = model.features[1]
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    state_path = tmp_path / "state.pt"
    torch.save(model.state_dict(), state_path)

    mp.spawn(
        eval_worker,
        args=(world_size, f"tcp://127.0.0.1:{free_port()}", str(state_path), str(tmp_path), SIZES),
        nprocs=world_size,
    )

    per_rank = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world_size)]
    assert all(results == per_rank[0] for results in per_rank)  # every rank got the same
    cpu = torch.device("cpu")
    for size, (accuracy, loss, count) in zip(SIZES, per_rank[0], strict=True):
        data = synthetic_splits(1, size, seed=3)
        whole = eval_batches(data, Feed(cpu, batch_size=size), rank=0, world_size=1)
        expected = evaluate(model, whole, device=cpu)
        assert count == expected.count == size
        assert accuracy == expected.accuracy
        assert loss == pytest.approx(expected.loss, rel=1e-6, abs=1e-6)


TRAIN = ["--device", "cpu", "--epochs", "2", "--train-size", "256", "--test-size", "101"]


def _train_worker(rank: int, world_size: int, port: int, checkpoint: str) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        DDPTUI_THREADS="1",
    )
    os.environ.pop("DDPTUI_ENDPOINT", None)
    torch.set_num_threads(1)
    from trainers import synthetic

    synthetic.main(
        [
            *TRAIN,
            "--init-method",
            f"tcp://127.0.0.1:{port}",
            "--batch-size",
            "16",
            "--checkpoint",
            checkpoint,
        ]
    )


@pytest.mark.slow
def test_two_ranks_train_like_one_rank_with_twice_the_batch(tmp_path, monkeypatch):
    """DDP averages gradients over ranks and DistributedSampler interleaves one permutation,
    so 2 ranks x 16 samples take the same steps as 1 rank x 32 (up to float rounding)."""
    two = tmp_path / "two" / "model.pt"
    mp.spawn(_train_worker, args=(2, free_port(), str(two)), nprocs=2)

    clean_env(monkeypatch)
    from trainers import synthetic

    one = tmp_path / "one.pt"
    synthetic.main([*TRAIN, "--batch-size", "32", "--checkpoint", str(one)])

    saved_two, saved_one = (torch.load(p, weights_only=True) for p in (two, one))
    assert saved_two["epoch"] == saved_one["epoch"] == 2
    for name, tensor in saved_one["model"].items():
        torch.testing.assert_close(saved_two["model"][name], tensor, atol=1e-5, rtol=1e-4)
    assert [p.name for p in two.parent.iterdir()] == ["model.pt"]


TRAINER_DATA = {
    "cifar10": (
        lambda root: write_cifar10(root, per_batch=4, test=6),  # 2 batches of 5 per rank
        ["--no-verify", "--batch-size", "5"],
        "(6 samples)",
    ),
    "imagefolder": (
        lambda root: write_imagefolder(root, train=4, val=1),  # 4 batches of 3 on one rank
        ["--image-size", "16", "--batch-size", "3"],
        "(3 samples)",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "trainer, launcher, workers, ranks",
    # Each launcher and each dataset once: a spawn rank's workers cost ~4 CPU-seconds each to
    # start (torch + torchvision), so the full product took 2.5 minutes of a 2-core machine.
    # That every dataset class pickles by name is checked without processes in
    # test_trainers_run.py (test_cifar10_datasets_pickle_for_dataloader_workers).
    # One worker under spawn (a spawn worker imports torch and torchvision anew, ~3 CPU-s
    # each; one shows the pickling as well as two), two under torchrun. One rank under spawn:
    # its workers start with spawn all the same, and its train and eval loaders' workers cost
    # half the suite's 16 CPU-s of two ranks; two ranks under torchrun.
    [("imagefolder", "spawn", 1, 1), ("cifar10", "torchrun", 2, 2)],
)
def test_dataloader_workers_under_both_launchers(trainer, launcher, workers, ranks, tmp_path):
    """``--workers N``: under mp.spawn the workers start with ``spawn`` too, so
    every dataset (and its transforms) must pickle by name."""
    write, extra, samples = TRAINER_DATA[trainer]
    write(tmp_path / "data")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_id = f"test-workers-{uuid.uuid4().hex[:12]}"
    env = {**os.environ, RUN_ID_ENV: run_id, THREADS_ENV: "1"}
    env.pop(ENDPOINT_ENV, None)
    argv = ["--device", "cpu", "--backend", "gloo", "--epochs", "1", "--lr", "0.01"]
    argv += ["--data-dir", str(tmp_path / "data"), "--workers", str(workers), *extra]
    command = [sys.executable, "-m", "ddptui.run.drivers", launcher, "--nprocs", str(ranks)]
    command += ["--run-dir", str(run_dir), "--module", f"trainers.{trainer}", "--", *argv]
    driver = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        output, _ = driver.communicate(timeout=150)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        for process in processes_of_run(run_id):  # torchrun's workers have their own sessions
            process.kill()
    logs = {rank: (run_dir / f"rank-{rank}.log").read_text() for rank in range(ranks)}
    assert driver.returncode == 0, output.decode(errors="replace") + "".join(logs.values())
    assert f"data: DataLoader, {workers} worker{'s' if workers > 1 else ''}" in logs[0]
    assert any(line.startswith("epoch 1/1 ") and samples in line for line in logs[0].splitlines())
    assert "Traceback" not in "".join(logs.values())
    assert processes_of_run(run_id) == []
