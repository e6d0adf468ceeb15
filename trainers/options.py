"""The command line every trainer shares, and the frozen config it turns into.

argparse stays at the edge: a trainer builds its parser with :func:`build_parser` (adding only
its own flags), and :func:`parse_config` returns a :class:`TrainConfig` that is passed down
into the loop. Nothing reads options from globals.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ddptui.constants import AMP_MODES, BACKENDS, DEVICE_CHOICES

#: ``--data-on-device``: ``auto`` holds in-memory datasets on CUDA devices when they fit.
DATA_ON_DEVICE_CHOICES = ("auto", "on", "off")
#: Bounds that keep a typo from becoming a run that never ends or a fork bomb.
MAX_EPOCHS = 1_000_000
MAX_WORKERS = 256


@dataclass(frozen=True)
class TrainConfig:
    """One run's settings, identical on every rank (saved in checkpoints as a dict)."""

    trainer: str
    """Trainer name (``synthetic``, ``mnist``, ...)."""
    model: str
    """Model architecture name; the choices depend on the trainer."""
    epochs: int
    """Last epoch to train (epochs are numbered from 1)."""
    batch_size: int
    """Training and evaluation batch size per rank."""
    lr: float
    """Learning rate."""
    seed: int = 0
    """Seed for weights, data order and synthetic data; the same on all ranks."""
    backend: str = "gloo"
    """torch.distributed backend: ``gloo`` or ``nccl``."""
    device: str = "cpu"
    """``cpu`` or ``cuda`` (each rank then uses ``cuda:LOCAL_RANK``)."""
    amp: str = "off"
    """Mixed precision: ``off``, ``fp16`` (autocast + GradScaler, CUDA only) or ``bf16``."""
    data_dir: str = "data"
    """Where the dataset lives (or is downloaded to with ``--download``)."""
    checkpoint: str | None = None
    """Where global rank 0 saves a checkpoint after every epoch; None saves nothing."""
    resume: str | None = None
    """Checkpoint to resume from; training continues with the epoch after the saved one."""
    init_method: str | None = None
    """Process-group rendezvous URL; None means ``env://`` under a launcher, else a free port."""
    sync_bn: bool = False
    """Convert BatchNorm layers to SyncBatchNorm (CUDA only)."""
    workers: int | None = None
    """DataLoader worker processes per rank; None: 0 on CPU, a share of the cores on CUDA."""
    data_on_device: str = "auto"
    """Hold an in-memory dataset on the rank's device: ``auto`` (on CUDA, if it fits), ``on``
    or ``off`` (see :mod:`trainers.batches`)."""
    train_size: int | None = None
    """Training samples: generated (synthetic) or the first N of the dataset; None = all."""
    test_size: int | None = None
    """Test samples: generated (synthetic) or the first N of the dataset; None = all."""
    image_size: int | None = None
    """Crop size for image-folder data (224 like ImageNet); None elsewhere."""
    download: bool = False
    """Download a missing dataset (rank 0 only) instead of failing."""
    verify_data: bool = True
    """Check the dataset files' published md5 sums where torchvision knows them."""


def build_parser(
    trainer: str,
    *,
    description: str | None,
    epochs: int,
    batch_size: int,
    lr: float,
    models: Sequence[str],
    train_size: int | None = None,
    test_size: int | None = None,
) -> argparse.ArgumentParser:
    """The shared parser with this trainer's defaults; the first of ``models`` is the default."""
    parser = argparse.ArgumentParser(
        prog=f"python -m trainers.{trainer}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(trainer=trainer)
    add = parser.add_argument
    add(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="process-group backend (default: nccl on CUDA, else gloo)",
    )
    add(
        "--device",
        choices=DEVICE_CHOICES,
        default="auto",
        help="where to train (default: cuda if available, else cpu)",
    )
    add("--amp", choices=AMP_MODES, default="off", help="mixed precision (default: off)")
    add("--epochs", type=_epochs, default=epochs, help=f"epochs (default: {epochs})")
    add(
        "--batch-size",
        type=positive_int,
        default=batch_size,
        help=f"batch size per rank (default: {batch_size})",
    )
    add("--lr", type=_lr, default=lr, help=f"learning rate (default: {lr})")
    add("--seed", type=_seed, default=0, help="random seed, same on every rank (default: 0)")
    add("--data-dir", default="data", help="dataset directory (default: ./data)")
    add(
        "--checkpoint",
        default=None,
        metavar="PATH",
        help="save a checkpoint here after every epoch (rank 0)",
    )
    add("--resume", default=None, metavar="PATH", help="resume from this checkpoint")
    add(
        "--init-method",
        default=None,
        metavar="URL",
        help="rendezvous: tcp://host:port or file://path "
        "(default: env:// under a launcher, else a free local port)",
    )
    add("--sync-bn", action="store_true", help="use SyncBatchNorm (CUDA only)")
    add(
        "--model",
        choices=list(models),
        default=models[0],
        help=f"model architecture (default: {models[0]})",
    )
    add(
        "--workers",
        type=_workers,
        default=None,
        metavar="N",
        help="DataLoader worker processes per rank (default: 0 on CPU; on CUDA this rank's "
        "share of the usable cores, less one)",
    )
    for split, default in (("train", train_size), ("test", test_size)):
        add(
            f"--{split}-size",
            type=positive_int,
            default=default,
            metavar="N",
            help=f"{split} samples to generate (default: {default})"
            if default
            else f"use only the first N {split} samples (default: all)",
        )
    return parser


def add_download_option(parser: argparse.ArgumentParser) -> None:
    """``--download``: fetch a missing dataset on rank 0 (needs internet)."""
    parser.add_argument(
        "--download",
        action="store_true",
        help="download the dataset into --data-dir if it is missing",
    )


def add_data_on_device_option(parser: argparse.ArgumentParser) -> None:
    """``--data-on-device``: for trainers whose dataset fits in memory."""
    parser.add_argument(
        "--data-on-device",
        choices=DATA_ON_DEVICE_CHOICES,
        default="auto",
        help="hold the dataset on the rank's device and augment it there "
        "(default: auto = on CUDA when it fits, else a DataLoader)",
    )


def parse_config(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> TrainConfig:
    """Parse ``argv`` (default ``sys.argv[1:]``) into a config with device and backend resolved."""
    args = parser.parse_args(argv)
    device = args.device
    if device == "auto":
        import torch  # here: trainers/parsers.py builds the parsers without torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = args.backend or ("nccl" if device == "cuda" else "gloo")
    return TrainConfig(
        trainer=args.trainer,
        model=args.model,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        backend=backend,
        device=device,
        amp=args.amp,
        data_dir=args.data_dir,
        checkpoint=args.checkpoint,
        resume=args.resume,
        init_method=args.init_method,
        sync_bn=args.sync_bn,
        workers=args.workers,
        train_size=args.train_size,
        test_size=args.test_size,
        image_size=getattr(args, "image_size", None),
        download=getattr(args, "download", False),
        data_on_device=getattr(args, "data_on_device", "auto"),
        verify_data=not getattr(args, "no_verify", False),
    )


def _int_between(low: int, high: int, name: str) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``."""

    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}, got {value}")
        return value

    parse.__name__ = name  # argparse's "invalid NAME value: 'x'"
    return parse


positive_int = _int_between(1, 2**31 - 1, "positive_int")
"""argparse type: an integer of at least 1."""
_epochs = _int_between(1, MAX_EPOCHS, "epochs")
_seed = _int_between(0, 2**32 - 1, "seed")  # seed arithmetic stays within torch.manual_seed
_workers = _int_between(0, MAX_WORKERS, "workers")


def _lr(text: str) -> float:
    """An argparse type: a positive finite number (argparse's "invalid lr value: 'x'")."""
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


_lr.__name__ = "lr"
