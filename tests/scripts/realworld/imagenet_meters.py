"""An ImageNet-style loop: ``AverageMeter``/``ProgressMeter``, top-1/top-5 accuracy, and between
forward and backward a barrier and three metric all-reduces (loss, acc@1, acc@5) read with
``.item()``; a validation pass doing the same each epoch; rank 0 saves ``checkpoint.pth.tar``
and copies the best. The shape of tczhangzhi/pytorch-distributed's ``distributed.py`` (itself
from pytorch/examples' imagenet), on CPU and gloo, a tiny model on a tiny ImageFolder. Written
for ddptui's tests; no ddptui import.

    torchrun --nproc-per-node 2 imagenet_meters.py --data DIR --out DIR [--epochs 2] [-b 8]
"""

import argparse
import os
import shutil
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.transforms as transforms
from facts import report


def tiny_cnn(num_classes):
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(8 * 16, num_classes),
    )


def tiny_mlp(num_classes):
    return nn.Sequential(
        nn.Flatten(), nn.Linear(3 * 16 * 16, 32), nn.ReLU(), nn.Linear(32, num_classes)
    )


MODELS = {"tiny_cnn": tiny_cnn, "tiny_mlp": tiny_mlp}

parser = argparse.ArgumentParser(description="ImageNet-style training")
parser.add_argument("--data", metavar="DIR", required=True, help="ImageFolder root (train/, val/)")
parser.add_argument("--out", metavar="DIR", default=".", help="where checkpoints go")
parser.add_argument("-a", "--arch", default="tiny_cnn", choices=sorted(MODELS))
parser.add_argument("-j", "--workers", default=0, type=int)
parser.add_argument("--epochs", default=2, type=int)
parser.add_argument("--start-epoch", default=0, type=int)
parser.add_argument("-b", "--batch-size", default=8, type=int, help="total over all ranks")
parser.add_argument("--lr", "--learning-rate", default=0.01, type=float, dest="lr")
parser.add_argument("--momentum", default=0.9, type=float)
parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
parser.add_argument("-p", "--print-freq", default=4, type=int)
parser.add_argument("--seed", default=0, type=int)
parser.add_argument("--local_rank", default=int(os.environ.get("LOCAL_RANK", 0)), type=int)


def reduce_mean(tensor, world_size):
    rt = tensor.clone()
    dist.all_reduce(rt, op=dist.ReduceOp.SUM)
    rt /= world_size
    return rt


class AverageMeter:
    """The current value and the running average of a metric."""

    def __init__(self, name, fmt=":f"):
        self.name, self.fmt = name, fmt
        self.val = self.avg = self.sum = self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def __str__(self):
        return ("{name} {val" + self.fmt + "} ({avg" + self.fmt + "})").format(**self.__dict__)


class ProgressMeter:
    def __init__(self, num_batches, meters, prefix=""):
        digits = len(str(num_batches))
        self.batch_fmt = "[{:" + str(digits) + "d}/" + str(num_batches) + "]"
        self.meters, self.prefix = meters, prefix

    def display(self, batch):
        print(
            "\t".join([self.prefix + self.batch_fmt.format(batch)] + [str(m) for m in self.meters]),
            flush=True,
        )


def accuracy(output, target, topk=(1,)):
    """Top-k accuracy in percent, one 1-element tensor per k."""
    with torch.no_grad():
        maxk = max(topk)
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand(maxk, -1))
        return [
            correct[:k].reshape(-1).float().sum(0, keepdim=True) * (100.0 / target.size(0))
            for k in topk
        ]


def adjust_learning_rate(optimizer, epoch, args):
    lr = args.lr * (0.1 ** (epoch // 30))
    for group in optimizer.param_groups:
        group["lr"] = lr


class Record:
    """What the script knows about its own training, for the facts line."""

    def __init__(self):
        self.steps, self.last_loss, self.last_reduced_loss, self.epoch_steps = 0, None, None, {}
        self.sync_s = []  # per step: the barrier and the metric all-reduces, as timed here


def train(loader, model, criterion, optimizer, epoch, args, record):
    batch_time, data_time = AverageMeter("Time", ":6.3f"), AverageMeter("Data", ":6.3f")
    losses, top1, top5 = (
        AverageMeter("Loss", ":.4e"),
        AverageMeter("Acc@1", ":6.2f"),
        AverageMeter("Acc@5", ":6.2f"),
    )
    progress = ProgressMeter(
        len(loader), [batch_time, data_time, losses, top1, top5], prefix=f"Epoch: [{epoch}]"
    )
    model.train()
    record.epoch_steps[epoch] = 0
    end = time.time()
    for i, (images, target) in enumerate(loader):
        data_time.update(time.time() - end)
        output = model(images)
        loss = criterion(output, target)
        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        sync_started = time.perf_counter()
        dist.barrier()
        reduced_loss = reduce_mean(loss, args.world_size)
        reduced_acc1 = reduce_mean(acc1, args.world_size)
        reduced_acc5 = reduce_mean(acc5, args.world_size)
        losses.update(reduced_loss.item(), images.size(0))
        top1.update(reduced_acc1.item(), images.size(0))
        top5.update(reduced_acc5.item(), images.size(0))
        record.sync_s.append(time.perf_counter() - sync_started)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record.steps += 1
        record.epoch_steps[epoch] += 1
        record.last_loss, record.last_reduced_loss = loss.item(), losses.val
        batch_time.update(time.time() - end)
        end = time.time()
        if i % args.print_freq == 0 and args.local_rank == 0:
            progress.display(i)


def validate(loader, model, criterion, args):
    losses, top1, top5 = (
        AverageMeter("Loss", ":.4e"),
        AverageMeter("Acc@1", ":6.2f"),
        AverageMeter("Acc@5", ":6.2f"),
    )
    model.eval()
    with torch.no_grad():
        for images, target in loader:
            output = model(images)
            loss = criterion(output, target)
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            dist.barrier()
            losses.update(reduce_mean(loss, args.world_size).item(), images.size(0))
            top1.update(reduce_mean(acc1, args.world_size).item(), images.size(0))
            top5.update(reduce_mean(acc5, args.world_size).item(), images.size(0))
    if args.local_rank == 0:
        print(f" * Acc@1 {top1.avg:.3f} Acc@5 {top5.avg:.3f}", flush=True)
    return top1.avg


def save_checkpoint(state, is_best, out):
    path = os.path.join(out, "checkpoint.pth.tar")
    torch.save(state, path)
    if is_best:
        shutil.copyfile(path, os.path.join(out, "model_best.pth.tar"))


def main():
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    dist.init_process_group(backend="gloo")
    args.world_size = dist.get_world_size()
    args.batch_size = args.batch_size // args.world_size
    train_dir, val_dir = os.path.join(args.data, "train"), os.path.join(args.data, "val")
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_set = datasets.ImageFolder(
        train_dir,
        transforms.Compose(
            [
                transforms.RandomResizedCrop(16),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                normalize,
            ]
        ),
    )
    val_set = datasets.ImageFolder(
        val_dir,
        transforms.Compose(
            [transforms.Resize(18), transforms.CenterCrop(16), transforms.ToTensor(), normalize]
        ),
    )
    model = nn.parallel.DistributedDataParallel(MODELS[args.arch](len(train_set.classes)))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(
        model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay
    )
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_set)
    val_sampler = torch.utils.data.distributed.DistributedSampler(val_set)
    train_loader = torch.utils.data.DataLoader(
        train_set, batch_size=args.batch_size, num_workers=args.workers, sampler=train_sampler
    )
    val_loader = torch.utils.data.DataLoader(
        val_set, batch_size=args.batch_size, num_workers=args.workers, sampler=val_sampler
    )
    record, best_acc1 = Record(), 0.0
    for epoch in range(args.start_epoch, args.epochs):
        train_sampler.set_epoch(epoch)
        val_sampler.set_epoch(epoch)
        adjust_learning_rate(optimizer, epoch, args)
        train(train_loader, model, criterion, optimizer, epoch, args, record)
        acc1 = validate(val_loader, model, criterion, args)
        is_best = acc1 > best_acc1
        best_acc1 = max(acc1, best_acc1)
        if args.local_rank == 0:
            state = {
                "epoch": epoch + 1,
                "arch": args.arch,
                "state_dict": model.module.state_dict(),
                "best_acc1": best_acc1,
            }
            save_checkpoint(state, is_best, args.out)
    report(
        dist.get_rank(),
        args.world_size,
        record.steps,
        record.last_loss,
        record.epoch_steps,
        last_reduced_loss=record.last_reduced_loss,
        median_sync_s=statistics.median(record.sync_s[2:]),
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
