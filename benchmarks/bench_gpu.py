"""GPU throughput and NVML cost, as ratios measured in one run (not a test).

Run on a machine with an NVIDIA GPU: uv run python benchmarks/bench_gpu.py [trainer] [logging]
[nvml] (all three by default; about a minute on one H100). Without a CUDA GPU it says so and
exits 0.

1. trainer: the built-in cifar10 trainer's training loop (ResNet-18, bf16, batch 128, its
   default data path: the dataset held on the GPU as uint8, cropped, flipped and normalised
   there, channels_last) on random CIFAR-shaped uint8 data in memory (no download), against a
   plain DDP loop over batches already on the GPU as normalised float tensors (same model,
   optimizer, batch, bf16, channels_last, no augmentation). Goal >= 0.8.
2. logging: ResNet-50, bf16, batch 128 of 224x224 images on the GPU, with the README's
   ``ddptui.log(loss=loss, samples=n)`` every step and a live collector
   (:class:`ddptui.run.collector.Collector` drained by a thread of this process), against the same
   loop without ddptui. Goal >= 0.99. For reference, also ``loss=loss.item()`` every step.
3. nvml: one real NVML snapshot in ms per GPU (:class:`ddptui.monitor.nvml.GpuSource`), without
   and with the PCIe throughput counters, and a whole :class:`ddptui.monitor.SystemMonitor`
   snapshot with its defaults.

Each comparison runs in interleaved blocks (the order alternating from block to block), in one
process: a world of one (an nccl process group on a free local port), as ``ddptui`` runs a
one-GPU machine. The device is waited for only at block boundaries, never per step. A ratio is
the median of the ratios of same-numbered blocks, with its 90 % interval (a sign-test interval,
``benchmath.median_interval``); a goal is met only when the whole interval clears it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # trainers/ from a checkout

from ddptui.runs import benchmath  # noqa: E402

PARTS = ("trainer", "logging", "nvml")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="*", metavar="PART", help=f"any of {', '.join(PARTS)}")
    parser.add_argument("--blocks", type=int, default=16, help="timed blocks per side")
    args = parser.parse_args(argv)
    parts = args.parts or list(PARTS)
    if unknown := sorted(set(parts) - set(PARTS)):
        parser.error(f"unknown part {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if not 1 <= args.blocks <= 1000:
        parser.error(f"--blocks must be from 1 to 1000, got {args.blocks}")
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress as it goes
    if not torch.cuda.is_available():
        print("no CUDA GPU: skipped (torch.cuda.is_available() is False)")
        return 0
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True  # as the trainers set it, for both sides of each part
    print(f"GPU: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    started = time.monotonic()
    os.environ.pop("DDPTUI_ENDPOINT", None)  # ddptui.log is a no-op unless a part sets it
    if "nvml" in parts:
        bench_nvml()
    if {"trainer", "logging"} & set(parts):
        with world_of_one(device):
            if "trainer" in parts:
                bench_trainer(device, args.blocks)
            if "logging" in parts:
                bench_logging(device, args.blocks)
    print(f"done in {time.monotonic() - started:.0f} s")
    return 0


@contextlib.contextmanager
def world_of_one(device: torch.device) -> Iterator[None]:
    """A process group of size one (nccl on CUDA) on a free local port, destroyed on leaving."""
    import torch.distributed as dist

    from ddptui.rank.net import free_port

    init = f"tcp://127.0.0.1:{free_port()}"
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=init, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def wait_for(device: torch.device) -> None:
    """Wait until ``device`` has done all queued work (block boundaries only)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )


def timed_blocks(
    sides: dict[str, Callable[[], int]], blocks: int, device: torch.device
) -> dict[str, list[float]]:
    """Samples/s of each side's ``blocks`` interleaved blocks, in block order (after a warm-up)."""
    for run_block in sides.values():  # cuDNN autotuning, DDP's first buckets, allocator
        run_block()
    rates: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for block in range(blocks):
        for name in names if block % 2 == 0 else names[::-1]:
            wait_for(device)
            started = time.perf_counter()
            samples = sides[name]()
            wait_for(device)
            rates[name].append(samples / (time.perf_counter() - started))
    return rates


def print_rates(rates: dict[str, list[float]], baseline: str, goal: float) -> None:
    """Each side's median block, and its ratio to ``baseline``: the median of the ratios of
    same-numbered blocks (run next to each other, so drift hits both) with its 90 % interval,
    and whether the interval clears ``goal``."""
    for name, values in rates.items():
        line = f"  {name:<48} {statistics.median(values):9,.0f} samples/s"
        if name != baseline:
            pairs = [on / off for off, on in zip(rates[baseline], values, strict=True)]
            around = benchmath.median_interval(pairs)
            if around.low >= goal:
                verdict = f"within the goal (>= {goal})"
            elif around.high < goal:
                verdict = f"under the goal (>= {goal})"
            else:
                verdict = f"not resolved: the interval spans the goal ({goal})"
            line += (
                f"  ratio {around.median:.3f} [{around.low:.3f}, {around.high:.3f}] over "
                f"{around.count} pairs: {verdict}"
            )
        print(line)


# -- 1. the built-in trainer against a plain loop -----------------------------------------
def bench_trainer(device: torch.device, blocks: int, batch: int = 128, steps: int = 40) -> None:
    from trainers import cifar10
    from trainers.distributed import DistContext
    from trainers.loop import autocast, build_trainer
    from trainers.options import TrainConfig

    print(
        f"== cifar10 trainer loop vs plain DDP loop (ResNet-18, bf16, batch {batch}, goal >= 0.8)"
    )
    size = batch * steps  # one "epoch" of the trainer is one timed block
    config = TrainConfig(
        trainer="cifar10",
        model="resnet18",
        epochs=1,
        batch_size=batch,
        lr=0.1,
        backend="nccl" if device.type == "cuda" else "gloo",
        device=device.type,
        amp="bf16",
        data_on_device="auto" if device.type == "cuda" else "on",
    )
    ctx = DistContext(0, 0, 1, 1, init_method="env://", launched=False)
    task = dataclasses.replace(cifar10.TASK, data=lambda *_: cifar_shaped(size))
    trainer = build_trainer(config, task, ctx, device)
    epoch = iter(range(1, 1_000_000))

    def trainer_block() -> int:
        trainer._run_epoch(next(epoch))  # the loop exactly as a run trains, without evaluation
        return size

    torch.manual_seed(0)
    model = cifar10.build_model(config, 10).to(device, memory_format=torch.channels_last)
    plain = ddp(model, device)
    optimizer = cifar10.build_optimizer(config, plain.parameters())
    batches = [
        (
            torch.randn(batch, 3, 32, 32, device=device).contiguous(
                memory_format=torch.channels_last
            ),
            torch.randint(10, (batch,), device=device),
        )
        for _ in range(steps)
    ]

    def plain_block() -> int:
        plain.train()
        for inputs, targets in batches:
            optimizer.zero_grad(set_to_none=True)
            with autocast(device, "bf16"):
                loss = torch.nn.functional.cross_entropy(plain(inputs), targets)
            loss.backward()
            optimizer.step()
        return size

    baseline = "plain DDP loop, batches on the GPU"
    sides = {baseline: plain_block, "cifar10 trainer loop": trainer_block}
    rates = timed_blocks(sides, blocks, device)
    print_rates(rates, baseline, 0.8)


def cifar_shaped(size: int):  # noqa: ANN201 - DataSplits
    """``size`` random CIFAR-shaped uint8 images with the CIFAR-10 trainer's preparation."""
    from torch.utils.data import TensorDataset

    from trainers.datasets import (
        CIFAR10_CROP_PADDING,
        CIFAR10_MEAN,
        CIFAR10_STD,
        DataSplits,
        InMemory,
    )

    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (size, 3, 32, 32), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 10, (size,), generator=generator)
    memory = InMemory(
        images,
        labels,
        images[:256],
        labels[:256],
        mean=CIFAR10_MEAN,
        std=CIFAR10_STD,
        crop_padding=CIFAR10_CROP_PADDING,
        flip=True,
    )
    dataset = TensorDataset(images, labels)  # the host path's stand-in (not used on CUDA)
    return DataSplits(dataset, dataset, 10, memory)


# -- 2. the README's logging against no ddptui --------------------------------------------
def bench_logging(
    device: torch.device, blocks: int, batch: int = 128, steps: int = 20, image: int = 224
) -> None:
    import ddptui
    from ddptui.constants import ENDPOINT_ENV, RUN_ID_ENV
    from ddptui.rank import reporter
    from ddptui.run.collector import Collector
    from trainers.loop import autocast
    from trainers.models import resnet

    print(f"== ResNet-50 bf16 batch {batch}: README logging to a live collector vs no ddptui")
    print("   (goal >= 0.99)")
    torch.manual_seed(0)
    model = resnet("resnet50", 1000).to(device, memory_format=torch.channels_last)
    wrapped = ddp(model, device)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.01, momentum=0.9)
    inputs = torch.randn(batch, 3, image, image, device=device).contiguous(
        memory_format=torch.channels_last
    )
    targets = torch.randint(1000, (batch,), device=device)

    def block(log: Callable[[torch.Tensor], None] | None) -> Callable[[], int]:
        def run() -> int:
            for _ in range(steps):
                optimizer.zero_grad(set_to_none=True)
                with autocast(device, "bf16"):
                    loss = torch.nn.functional.cross_entropy(wrapped(inputs), targets)
                loss.backward()
                optimizer.step()
                if log is not None:
                    log(loss)
            return steps * batch

        return run

    collector = Collector("bench-gpu")
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            collector.poll(0.05)

    drainer = threading.Thread(target=drain, name="collector", daemon=True)
    drainer.start()
    os.environ.update({ENDPOINT_ENV: collector.endpoint, RUN_ID_ENV: "bench-gpu"})
    reporter.reset_reporter()
    try:
        sides = {
            "without ddptui": block(None),
            "ddptui.log(loss=loss, samples=n)": block(
                lambda loss: ddptui.log(loss=loss, samples=batch)
            ),
            "ddptui.log(loss=loss.item(), ...) (old README)": block(
                lambda loss: ddptui.log(loss=loss.item(), samples=batch)
            ),
        }
        rates = timed_blocks(sides, blocks, device)
        sent = reporter.get_reporter()
        print_rates(rates, "without ddptui", 0.99)
        time.sleep(0.3)  # let the last batch of events arrive
        print(
            f"  events sent {getattr(sent, 'sent', '?')}, dropped {getattr(sent, 'dropped', '?')}, "
            f"received by the collector {collector.stats.received}"
        )
    finally:
        reporter.reset_reporter()
        os.environ.pop(ENDPOINT_ENV, None)
        stop.set()
        drainer.join(5)
        collector.close()


# -- 3. NVML -------------------------------------------------------------------------------
def bench_nvml(samples: int = 20, pcie_samples: int = 3) -> None:
    from ddptui.monitor import SystemMonitor
    from ddptui.monitor.nvml import GpuSource

    print("== one NVML snapshot, ms per GPU")
    with GpuSource() as gpus:
        report = gpus.sample()  # starts NVML; not timed
        if not report.available:
            print(f"  NVML unavailable: {report.reason}")
            return
        # A snapshot reads no PCIe throughput; the PCIe readings are their own call (a
        # thread of their own in SystemMonitor(pcie=...)), ~20 ms per counter by NVIDIA's doc.
        for label, read, count in (
            ("snapshot (no PCIe)", gpus.sample, samples),
            ("PCIe throughput readings", gpus.sample_pcie, pcie_samples),
        ):
            started = time.perf_counter()
            for _ in range(count):
                read()
            per_gpu = (time.perf_counter() - started) / count / len(report.devices) * 1e3
            print(f"  GpuSource {label:<26} {per_gpu:8.3f} ms per GPU ({len(report.devices)} GPUs)")
    with SystemMonitor() as monitor:
        monitor.sample()
        started = time.perf_counter()
        for _ in range(pcie_samples):
            monitor.sample()
        elapsed = (time.perf_counter() - started) / pcie_samples * 1e3
    print(f"  SystemMonitor() defaults, whole snapshot  {elapsed:8.3f} ms (GPUs, host, processes)")


if __name__ == "__main__":
    sys.exit(main())
