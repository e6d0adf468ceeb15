"""Real multi-process gloo groups: distributed evaluation and a two-rank training run."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.multiprocessing as mp

from ddptui.net import free_port
from tests.trainer_data import bn_model, clean_env, eval_worker
from trainers.datasets import synthetic_images
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
    for size, (accuracy, loss, count) in zip(SIZES, per_rank[0], strict=True):
        expected = evaluate(
            model,
            synthetic_images(size, seed=3, train=False),
            device=torch.device("cpu"),
            batch_size=size,
        )
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
