"""MNIST with a small ConvNet, a tqdm bar and prints on rank 0 only, an evaluation summed with
collectives: the shape of KaiiZhang/DDP-Tutorial's ``codes/mnist-env.py`` (env:// start, a
``--local_rank`` argument, ``GradScaler(enabled=--use_mix_precision)``), on CPU and gloo.
Written for ddptui's tests; no ddptui import. The data is read from MNIST's IDX files under
``--data`` (never downloaded).

    torchrun --nproc-per-node 2 mnist_tqdm.py --data DIR [-e EPOCHS] [-b BATCH]

CPU edits: gloo instead of nccl, no SyncBatchNorm (it needs a GPU), all_reduce instead of
reduce for the evaluation counts (gloo).
"""

import argparse
import os
from datetime import datetime

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
import torchvision.transforms as transforms
from facts import report
from tqdm import tqdm


class ConvNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.layer1 = nn.Sequential(
            nn.Conv2d(1, 8, kernel_size=5, stride=1, padding=2),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),
        )
        self.layer2 = nn.Sequential(
            nn.Conv2d(8, 8, kernel_size=5, stride=1, padding=2),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),
        )
        self.fc = nn.Linear(7 * 7 * 8, num_classes)

    def forward(self, x):
        out = self.layer2(self.layer1(x))
        return self.fc(out.reshape(out.size(0), -1))


def evaluate(model, test_loader, rank):
    model.eval()
    size = torch.tensor(0.0)
    correct = torch.tensor(0.0)
    with torch.no_grad():
        for images, labels in tqdm(test_loader) if rank == 0 else test_loader:
            outputs = model(images)
            size += images.shape[0]
            correct += (outputs.argmax(1) == labels).type(torch.float).sum()
    dist.all_reduce(size, op=dist.ReduceOp.SUM)
    dist.all_reduce(correct, op=dist.ReduceOp.SUM)
    if rank == 0:
        print(f"Evaluate accuracy is {correct / size:.2f}", flush=True)
    return int(size.item())


def train(args):
    dist.init_process_group(backend="gloo", init_method="env://")
    args.rank = dist.get_rank()
    torch.manual_seed(0)
    model = ConvNet()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), 1e-2)
    model = nn.parallel.DistributedDataParallel(model)
    scaler = torch.amp.GradScaler(enabled=args.use_mix_precision)

    train_dataset = torchvision.datasets.MNIST(
        root=args.data, train=True, transform=transforms.ToTensor(), download=False
    )
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
    train_loader = torch.utils.data.DataLoader(
        dataset=train_dataset,
        batch_size=args.batch_size,
        shuffle=False,
        num_workers=0,
        sampler=train_sampler,
    )
    test_dataset = torchvision.datasets.MNIST(
        root=args.data, train=False, transform=transforms.ToTensor(), download=False
    )
    test_sampler = torch.utils.data.distributed.DistributedSampler(test_dataset)
    test_loader = torch.utils.data.DataLoader(
        dataset=test_dataset, batch_size=args.batch_size, shuffle=False, sampler=test_sampler
    )
    start = datetime.now()
    total_step = len(train_loader)
    steps, last_loss, epoch_steps, evaluated = 0, None, {}, 0
    for epoch in range(args.epochs):
        train_loader.sampler.set_epoch(epoch)
        model.train()
        epoch_steps[epoch] = 0
        for i, (images, labels) in enumerate(
            tqdm(train_loader) if args.rank == 0 else train_loader
        ):
            with torch.autocast("cpu", enabled=args.use_mix_precision):
                outputs = model(images)
                loss = criterion(outputs, labels)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            steps += 1
            epoch_steps[epoch] += 1
            last_loss = loss.item()
            if (i + 1) % 5 == 0 and args.rank == 0:
                print(
                    f"Epoch [{epoch + 1}/{args.epochs}], Step [{i + 1}/{total_step}], "
                    f"Loss: {last_loss:.4f}",
                    flush=True,
                )
        evaluated = evaluate(model, test_loader, args.rank)
    report(args.rank, dist.get_world_size(), steps, last_loss, epoch_steps, evaluated=evaluated)
    dist.destroy_process_group()
    if args.rank == 0:
        print("Training complete in: " + str(datetime.now() - start), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True, help="directory holding MNIST/raw")
    parser.add_argument("-e", "--epochs", default=2, type=int, metavar="N")
    parser.add_argument("-b", "--batch_size", default=8, type=int, metavar="N")
    parser.add_argument(
        "--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)), help="rank in node"
    )
    parser.add_argument("--use_mix_precision", default=False, action="store_true")
    train(parser.parse_args())


if __name__ == "__main__":
    main()
