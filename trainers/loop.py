"""The one DDP training loop every trainer runs: train, evaluate, checkpoint, report.

A trainer describes its data, model and optimizer in a :class:`Task` and calls :func:`run`
with its :class:`~trainers.options.TrainConfig`. :func:`run` joins the process group,
:func:`build_trainer` builds everything, and :class:`Trainer` reads top to bottom::

    for epoch in start..epochs:
        _run_epoch(epoch)        # batches.set_epoch (reshuffle), _run_batch per step
        evaluate(epoch)          # sharded over ranks, each test sample counted once
        _save_checkpoint(epoch)  # global rank 0, atomic

Stop with a checkpoint: when ddptui asks (:mod:`trainers.stopping`), the ranks agree on a step,
finish it, rank 0 writes a checkpoint that records the epoch and the steps of it already done,
and every rank ends cleanly. ``--resume`` of that checkpoint continues the same epoch where it
stopped: same sampler order, the batches already done are skipped (read and dropped, so the
order stays exactly the same).

How batches reach the device (a DataLoader, or the dataset held on the GPU) is
:mod:`trainers.batches`' business; the loop only iterates them. Every step is reported with
``ddptui.log`` and every evaluation with ``ddptui.log_eval``, exactly as a user's own script
would. The loss goes to ``ddptui.log`` as a 0-dim tensor: no step waits for the device to
read it (the reporter reads it when it is ready). Evaluation waits for the device once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

import ddptui
from ddptui.rank.cpus import threads_per_rank
from ddptui.rank.reporter import cuda_uuid
from trainers.batches import Feed, choose_feed, eval_batches, train_batches
from trainers.checkpoint import remove_stale_temps, save_atomic
from trainers.datasets import DataSplits
from trainers.distributed import DistContext, context_from_env
from trainers.options import TrainConfig
from trainers.stopping import StopVote, install_stop_handler


class CheckpointError(RuntimeError):
    """A checkpoint to resume from is missing, unreadable or from another trainer."""


@dataclass(frozen=True)
class Task:
    """What a trainer contributes to the loop; everything else is shared."""

    data: Callable[[TrainConfig, DistContext, torch.device], DataSplits]
    """Builds the datasets (after the process group exists, so rank 0 may download first)."""
    model: Callable[[TrainConfig, int], nn.Module]
    """Builds the model for ``num_classes`` outputs (seeded identically on every rank)."""
    optimizer: Callable[[TrainConfig, Iterable[nn.Parameter]], Optimizer]
    scheduler: Callable[[TrainConfig, Optimizer], LRScheduler] | None = None
    """Optional learning-rate schedule, stepped once per epoch."""


@dataclass(frozen=True)
class EvalResult:
    """An evaluation over the whole test set, all-reduced over ranks."""

    accuracy: float
    loss: float
    """Mean per-sample cross-entropy."""
    count: int
    """Test samples seen over all ranks (the test set's size)."""


def run(config: TrainConfig, task: Task) -> EvalResult | None:
    """Train and evaluate ``task`` as this process's rank; returns the last evaluation (None
    when the run was stopped with a checkpoint before one).

    Reports ``ddptui.finished`` (with ``"ExcType: message"`` on failure, then re-raises) and
    destroys the process group on every way out.
    """
    install_stop_handler()  # first: ddptui may ask to stop as soon as the rank has started
    try:
        ctx = context_from_env(config.init_method)
        device = resolve_device(config, ctx)
        _default_threads(ctx)
        dist.init_process_group(
            config.backend, init_method=ctx.init_method, rank=ctx.rank, world_size=ctx.world_size
        )
        if device.type == "cuda":
            torch.cuda.set_device(device)
        ddptui.started(
            device=str(device),
            device_uuid=cuda_uuid(device.index) if device.type == "cuda" else None,
            epochs=config.epochs,
        )
        trainer = build_trainer(config, task, ctx, device)
        # Known only now that the data is loaded: lets ddptui show progress from step one.
        ddptui.started(steps_per_epoch=len(trainer.train_batches))
        result = trainer.train()
    except BaseException as exc:
        ddptui.finished(error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    ddptui.finished()
    return result


def build_trainer(
    config: TrainConfig, task: Task, ctx: DistContext, device: torch.device
) -> Trainer:
    """This rank's :class:`Trainer`, inside an initialised process group on ``device``.

    Global rank 0 first removes checkpoint temp files that a killed run left behind. A
    convolutional model on CUDA is laid out channels_last, once, here (its inputs arrive in
    the same layout, see :class:`~trainers.batches.Feed`), and cuDNN autotuning is turned on.
    """
    if config.checkpoint and ctx.is_main:
        for stale in remove_stale_temps(config.checkpoint):
            print(f"removed {stale}, left by a run that was killed while saving", flush=True)
    data = task.data(config, ctx, device).first(config.train_size, config.test_size)
    torch.manual_seed(config.seed)  # identical initial weights on every rank
    model = task.model(config, data.num_classes)
    if config.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model.to(device)
    channels_last = device.type == "cuda" and is_convolutional(model)
    if channels_last:
        model.to(memory_format=torch.channels_last)
        # cuDNN times its convolution algorithms once per input shape and keeps the fastest.
        torch.backends.cudnn.benchmark = True
    optimizer = task.optimizer(config, model.parameters())
    scheduler = task.scheduler(config, optimizer) if task.scheduler else None
    feed = choose_feed(
        data,
        device,
        batch_size=config.batch_size,
        data_on_device=config.data_on_device,
        workers=config.workers,
        local_world_size=ctx.local_world_size,
        channels_last=channels_last,
    )
    if ctx.is_main:
        print(f"data: {feed.describe()}", flush=True)
    # From here on ranks should differ (dropout masks, augmentation), not repeat each other.
    torch.manual_seed(config.seed + ctx.rank)
    return Trainer(config, ctx, device, model, optimizer, scheduler, data, feed)


def is_convolutional(model: nn.Module) -> bool:
    """Whether ``model`` has 2-d convolutions (which run faster channels_last on CUDA)."""
    return any(isinstance(module, nn.Conv2d) for module in model.modules())


def resolve_device(config: TrainConfig, ctx: DistContext) -> torch.device:
    """This rank's device (``cuda:LOCAL_RANK`` or cpu), refusing combinations that can't run."""
    if config.device == "cpu":
        if config.backend == "nccl":
            raise ValueError("the nccl backend needs CUDA; use --backend gloo on CPU")
        if config.amp == "fp16":
            raise ValueError(
                "--amp fp16 needs CUDA (fp16 autocast with a GradScaler); "
                "use --amp bf16 or off on CPU"
            )
        if config.sync_bn:
            raise ValueError("--sync-bn needs CUDA: torch's SyncBatchNorm only runs on GPUs")
        return torch.device("cpu")
    if config.device != "cuda":
        raise ValueError(f"unknown device {config.device!r}; use cpu or cuda")
    if not torch.cuda.is_available():
        raise ValueError("--device cuda but CUDA is not available here")
    if ctx.local_rank >= torch.cuda.device_count():
        raise ValueError(
            f"LOCAL_RANK {ctx.local_rank} has no GPU: only {torch.cuda.device_count()} visible"
        )
    if config.amp == "bf16" and not torch.cuda.is_bf16_supported():
        raise ValueError("--amp bf16: this GPU does not support bfloat16; use fp16")
    return torch.device("cuda", ctx.local_rank)


class Trainer:
    """Runs the epochs for one rank: a DDP-wrapped model, its optimizer and the data."""

    def __init__(
        self,
        config: TrainConfig,
        ctx: DistContext,
        device: torch.device,
        model: nn.Module,
        optimizer: Optimizer,
        scheduler: LRScheduler | None,
        data: DataSplits,
        feed: Feed,
    ) -> None:
        self.config = config
        self.ctx = ctx
        self.device = device
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.data = data
        self.scaler = torch.amp.GradScaler("cuda") if config.amp == "fp16" else None
        self.start_epoch = 1
        #: Steps of ``start_epoch`` done before a stop (skipped when resuming).
        self.skip_steps = 0
        if config.resume:
            self.start_epoch = self._load_checkpoint(model, config.resume) + 1
        # Wrapped after resuming on purpose: DDP's constructor is a collective, so no rank
        # trains (and rank 0 cannot overwrite the checkpoint) before every rank has read it.
        cuda = device.type == "cuda"
        self.model = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
        shard = {"rank": ctx.rank, "world_size": ctx.world_size}
        self.train_batches = train_batches(data, feed, seed=config.seed, **shard)
        self.eval_batches = eval_batches(data, feed, **shard)
        self.stop_vote = StopVote()  # a collective too: every rank builds it here

    def train(self) -> EvalResult | None:
        """Train the remaining epochs, evaluating (and checkpointing) after each; stop after
        an agreed step, with a checkpoint, when ddptui asks."""
        try:
            return self._train()
        finally:
            self.stop_vote.close()

    def _train(self) -> EvalResult | None:
        result = None
        if self.start_epoch > self.config.epochs:  # resumed after the last epoch
            epoch = self.start_epoch - 1
            started = time.monotonic()
            result = self.evaluate(epoch)
            self._print_epoch(epoch, result, time.monotonic() - started)
            return result
        for epoch in range(self.start_epoch, self.config.epochs + 1):
            started = time.monotonic()
            done = self._run_epoch(epoch)
            if done is not None:  # stopped after step ``done`` of this epoch
                if self.config.checkpoint and self.ctx.is_main:
                    self._save_checkpoint(epoch - 1, partial={"epoch": epoch, "steps": done})
                if self.ctx.is_main:
                    print(f"stopped in epoch {epoch} after step {done}: checkpoint written")
                return result
            if self.scheduler is not None:
                self.scheduler.step()
            result = self.evaluate(epoch)
            if self.config.checkpoint and self.ctx.is_main:
                self._save_checkpoint(epoch)
            self._print_epoch(epoch, result, time.monotonic() - started)
        return result

    def _run_epoch(self, epoch: int) -> int | None:
        """One epoch (or its rest, after a stop); the step it stopped after, if it did."""
        self.model.train()
        self.train_batches.set_epoch(epoch)
        skip, self.skip_steps = (self.skip_steps, 0) if epoch == self.start_epoch else (0, 0)
        for index, (inputs, targets) in enumerate(self.train_batches, start=1):
            if index <= skip:
                continue  # done before the stop this run resumes from: same order, no step
            loss = self._run_batch(inputs, targets)
            # A 0-dim tensor, not loss.item(): reading it here would wait for the device.
            ddptui.log(epoch=epoch, loss=loss, samples=len(targets))
            if self.stop_vote.agreed():
                return index
        return None

    def _run_batch(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.device, self.config.amp):
            loss = F.cross_entropy(self.model(inputs), targets)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        return loss.detach()

    def evaluate(self, epoch: int) -> EvalResult:
        """Evaluate rank 0's weights on the test set, sharded over ranks; report it."""
        module = self.model.module
        sync_buffers(module)
        result = evaluate(module, self.eval_batches, device=self.device, amp=self.config.amp)
        ddptui.log_eval(epoch=epoch, accuracy=result.accuracy, loss=result.loss, count=result.count)
        return result

    def _save_checkpoint(self, epoch: int, partial: dict[str, int] | None = None) -> None:
        """Write the checkpoint atomically (:func:`trainers.checkpoint.save_atomic`).

        ``epoch`` is the last complete epoch; ``partial`` (a stop) the epoch in progress and
        its steps done."""
        state = {
            "model": self.model.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "epoch": epoch,
            "config": asdict(self.config),
        }
        if partial is not None:
            state["partial"] = partial
        save_atomic(state, self.config.checkpoint)  # type: ignore[arg-type]

    def _load_checkpoint(self, model: nn.Module, path: str) -> int:
        """Restore model, optimizer, scaler and schedule from ``path``; returns its epoch."""
        if not Path(path).is_file():
            raise CheckpointError(f"cannot resume: checkpoint {path} does not exist")
        try:
            state = torch.load(path, map_location=self.device, weights_only=True)
            epoch = int(state["epoch"])
            trainer = state["config"]["trainer"]
        except Exception as exc:
            raise CheckpointError(
                f"cannot resume from {path}: not a readable checkpoint "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        if trainer != self.config.trainer:
            raise CheckpointError(
                f"cannot resume from {path}: it was saved by the {trainer!r} trainer, "
                f"not {self.config.trainer!r}"
            )
        try:
            model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            if self.scaler is not None and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
            if self.scheduler is not None and state.get("scheduler"):
                self.scheduler.load_state_dict(state["scheduler"])
        except (KeyError, ValueError, RuntimeError) as exc:
            raise CheckpointError(
                f"cannot resume from {path}: it does not fit this model/optimizer "
                f"(saved with {state['config'].get('model')!r}): {exc}"
            ) from exc
        partial = state.get("partial")
        if isinstance(partial, dict) and partial.get("epoch") == epoch + 1:
            self.skip_steps = max(0, int(partial.get("steps", 0)))
        return epoch

    def _print_epoch(self, epoch: int, result: EvalResult, seconds: float) -> None:
        if self.ctx.is_main:
            print(
                f"epoch {epoch}/{self.config.epochs} loss {result.loss:.4f} "
                f"acc {result.accuracy:.4f} ({result.count} samples) {seconds:.1f}s",
                flush=True,
            )


def evaluate(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    device: torch.device,
    amp: str = "off",
) -> EvalResult:
    """Accuracy and mean loss of ``model`` (unwrapped, not DDP) over a sharded test set.

    ``batches`` are this rank's shard (:func:`trainers.batches.eval_batches`: every test sample
    on exactly one rank). Under an initialised process group one float64 ``all_reduce`` sums
    correct predictions, sample count and loss sum over ranks, so the result equals a
    single-process evaluation; without one it is that single-process evaluation. The device
    is waited for once, at the end.
    """
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # correct, count, loss sum
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for inputs, targets in batches:
            with autocast(device, amp):
                logits = model(inputs)
            logits = logits.float()
            totals[0] += (logits.argmax(dim=1) == targets).sum()
            totals[1] += len(targets)
            totals[2] += F.cross_entropy(logits, targets, reduction="sum").double()
    model.train(was_training)
    if world_size > 1:
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    correct, count, loss_sum = totals.tolist()  # the one wait for the device
    if count == 0:
        return EvalResult(accuracy=0.0, loss=0.0, count=0)
    return EvalResult(accuracy=correct / count, loss=loss_sum / count, count=int(count))


def sync_buffers(module: nn.Module, src: int = 0) -> None:
    """Give every rank ``src``'s buffers (BatchNorm running statistics), if distributed.

    Each rank's last training forward updates its running stats locally; rank 0's are the
    ones DDP broadcasts at the next forward and the checkpoint saves, so evaluate with those.
    """
    if dist.is_initialized() and dist.get_world_size() > 1:
        for buffer in module.buffers():
            dist.broadcast(buffer, src=src)


def autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` for ``--amp`` (fp16 or bf16) on ``device``; a no-op for ``off``."""
    if amp == "off":
        return contextlib.nullcontext()
    if amp not in _AMP_DTYPES:
        raise ValueError(f"unknown --amp {amp!r}; use off, fp16 or bf16")
    if amp == "fp16" and device.type != "cuda":
        raise ValueError("--amp fp16 needs CUDA; use --amp bf16 or off on CPU")
    return torch.autocast(device_type=device.type, dtype=_AMP_DTYPES[amp])


_AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _default_threads(ctx: DistContext) -> None:
    """Split the usable CPU cores between this machine's ranks (ddptui's choice if it made one)."""
    torch.set_num_threads(threads_per_rank(ctx.local_world_size))
