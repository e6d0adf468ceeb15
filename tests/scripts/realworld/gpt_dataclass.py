"""A GPT-style character model trained by a dataclass-configured ``Trainer``: the shape of
pytorch/examples' ``distributed/minGPT-ddp`` (hydra there; plain dataclasses with
``section.field=value`` overrides here), on CPU and gloo. Written for ddptui's tests; no
ddptui import.

    torchrun --nproc-per-node 2 gpt_dataclass.py [trainer.max_epochs=2] [data.steps=10] ...

What makes the shape: ``_run_batch(source, targets, train)`` under ``set_grad_enabled`` and a
disabled autocast, a ``GradScaler(enabled=False)`` the loop always goes through, gradient
clipping, AdamW with decay / no-decay groups, a snapshot as a dataclass, and an evaluation pass
over the test split through the same DDP model (grad off, still in train mode) every epoch.
"""

import math
import os
import sys
from dataclasses import asdict, dataclass, field, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
from facts import report
from torch.distributed import destroy_process_group, get_rank, get_world_size, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, random_split
from torch.utils.data.distributed import DistributedSampler


@dataclass
class GPTConfig:
    vocab_size: int = 0  # set from the data
    block_size: int = 16
    n_embd: int = 32
    n_head: int = 2
    n_layer: int = 1
    dropout: float = 0.0


@dataclass
class OptimizerConfig:
    learning_rate: float = 3e-3
    weight_decay: float = 0.1


@dataclass
class DataConfig:
    steps: int = 10  # training steps per epoch and rank
    batch_size: int = 8
    train_split: float = 0.8


@dataclass
class TrainerConfig:
    max_epochs: int = 2
    save_every: int = 1
    grad_norm_clip: float = 1.0
    use_amp: bool = False
    snapshot_path: str = "gpt_snapshot.pt"
    log_every: int = 4


@dataclass
class Config:
    gpt: GPTConfig = field(default_factory=GPTConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


def load_config(overrides: list[str]) -> Config:
    """Defaults, then ``section.field=value`` overrides (hydra's command-line syntax)."""
    cfg = Config()
    for item in overrides:
        key, _, value = item.partition("=")
        section_name, _, name = key.partition(".")
        section = getattr(cfg, section_name, None)
        known = {f.name: f.type for f in fields(section)} if section is not None else {}
        if name not in known:
            sys.exit(f"unknown config key {key!r}")
        kind = known[name]
        parsed = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
        setattr(section, name, parsed)
    return cfg


@dataclass
class Snapshot:
    model_state: dict
    optimizer_state: dict
    finished_epoch: int


class CharDataset(Dataset):
    """(block of characters, the same block shifted by one) pairs over a text."""

    def __init__(self, text: str, block_size: int):
        chars = sorted(set(text))
        self.stoi = {ch: i for i, ch in enumerate(chars)}
        self.vocab_size = len(chars)
        self.block_size = block_size
        self.data = torch.tensor([self.stoi[ch] for ch in text], dtype=torch.long)

    def __len__(self):
        return len(self.data) - self.block_size - 1

    def __getitem__(self, index):
        chunk = self.data[index : index + self.block_size + 1]
        return chunk[:-1], chunk[1:]


def corpus(chars: int) -> str:
    """A deterministic text with some structure to learn (no download)."""
    words = ["the", "rank", "waits", "for", "its", "peers", "and", "then", "all", "reduce"]
    out, i = [], 0
    while sum(map(len, out)) < chars:
        out.append(words[(i * 7 + i // 3) % len(words)] + (". " if i % 9 == 8 else " "))
        i += 1
    return "".join(out)[:chars]


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        )
        self.n_head = cfg.n_head

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Parameter(torch.zeros(1, cfg.block_size, cfg.n_embd))
        self.blocks = nn.Sequential(*[Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx, targets=None):
        x = self.tok(idx) + self.pos[:, : idx.size(1)]
        logits = self.head(self.ln_f(self.blocks(x)))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def create_optimizer(model: nn.Module, cfg: OptimizerConfig):
    """AdamW; weights of Linear layers decay, biases, norms, embeddings do not."""
    decay, no_decay = [], []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            (decay if isinstance(module, nn.Linear) and name == "weight" else no_decay).append(
                param
            )
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(0.9, 0.95))


class Trainer:
    def __init__(self, cfg: TrainerConfig, model, optimizer, train_dataset, test_dataset, batch):
        self.config = cfg
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.train_loader = self._prepare_dataloader(train_dataset, batch)
        self.test_loader = self._prepare_dataloader(test_dataset, batch)
        self.epochs_run = 0
        self.model = model
        self.optimizer = optimizer
        self.scaler = torch.amp.GradScaler(enabled=cfg.use_amp)
        self.steps, self.last_loss, self.epoch_steps, self.eval_losses = 0, None, {}, []
        self._load_snapshot()
        self.model = DDP(self.model)

    def _prepare_dataloader(self, dataset, batch):
        return DataLoader(
            dataset, batch_size=batch, shuffle=False, sampler=DistributedSampler(dataset)
        )

    def _load_snapshot(self):
        try:
            data = torch.load(self.config.snapshot_path, map_location="cpu")
        except FileNotFoundError:
            print("Snapshot not found. Training model from scratch", flush=True)
            return
        snapshot = Snapshot(**data)
        self.model.load_state_dict(snapshot.model_state)
        self.optimizer.load_state_dict(snapshot.optimizer_state)
        self.epochs_run = snapshot.finished_epoch

    def _run_batch(self, source, targets, train: bool = True) -> float:
        with (
            torch.set_grad_enabled(train),
            torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=self.config.use_amp),
        ):
            _, loss = self.model(source, targets)
        if train:
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_norm_clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        return loss.item()

    def _run_epoch(self, epoch: int, dataloader: DataLoader, train: bool = True):
        dataloader.sampler.set_epoch(epoch)
        step_type = "Train" if train else "Eval"
        for it, (source, targets) in enumerate(dataloader):
            batch_loss = self._run_batch(source, targets, train)
            if train:
                self.steps += 1
                self.last_loss = batch_loss
                self.epoch_steps[epoch] = self.epoch_steps.get(epoch, 0) + 1
            else:
                self.eval_losses.append(batch_loss)
            if it % self.config.log_every == 0:
                print(
                    f"[RANK{self.global_rank}] Epoch {epoch} | Iter {it} | "
                    f"{step_type} Loss {batch_loss:.5f}",
                    flush=True,
                )

    def _save_snapshot(self, epoch):
        raw = self.model.module if hasattr(self.model, "module") else self.model
        snapshot = Snapshot(raw.state_dict(), self.optimizer.state_dict(), epoch)
        torch.save(asdict(snapshot), self.config.snapshot_path)
        print(f"Snapshot saved at epoch {epoch}", flush=True)

    def train(self):
        for epoch in range(self.epochs_run, self.config.max_epochs):
            epoch += 1
            self._run_epoch(epoch, self.train_loader, train=True)
            if self.local_rank == 0 and epoch % self.config.save_every == 0:
                self._save_snapshot(epoch)
            self._run_epoch(epoch, self.test_loader, train=False)


def main(cfg: Config):
    init_process_group(backend="gloo")
    torch.manual_seed(0)
    world = get_world_size()
    train_samples = cfg.data.steps * cfg.data.batch_size * world
    chars = math.ceil(train_samples / cfg.data.train_split) + cfg.gpt.block_size + 1
    dataset = CharDataset(corpus(chars), cfg.gpt.block_size)
    train_len = train_samples
    test_len = len(dataset) - train_len
    train_set, test_set = random_split(
        dataset, [train_len, test_len], generator=torch.Generator().manual_seed(0)
    )
    cfg.gpt.vocab_size = dataset.vocab_size
    model = GPT(cfg.gpt)
    optimizer = create_optimizer(model, cfg.optimizer)
    trainer = Trainer(cfg.trainer, model, optimizer, train_set, test_set, cfg.data.batch_size)
    trainer.train()
    report(
        get_rank(),
        world,
        trainer.steps,
        trainer.last_loss,
        trainer.epoch_steps,
        eval_batches=len(trainer.eval_losses),
    )
    destroy_process_group()


if __name__ == "__main__":
    main(load_config(sys.argv[1:]))
