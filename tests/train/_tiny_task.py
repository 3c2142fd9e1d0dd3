"""A tiny token-tagging task for engine tests, importable or runnable as a script.

Each item is a length-6 sequence over a vocab of 11 with 1..6 real tokens (rest is padding);
the target of token t is t % 5, with some label noise. Loss is the mean cross-entropy over the
non-pad targets and StepOutput.weight is their count, so micro-batches carry unequal weights.

Script use (the engine tests run it in subprocesses and under torchrun):
    python tests/train/_tiny_task.py RUN_DIR [--resume] [--dropout P] [--sleep S]
        [key=value TrainConfig overrides ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.configs import apply_overrides, parse_key_values
from attnlab.data.buckets import shuffled_batches
from attnlab.train import StepOutput, TrainConfig, Trainer, seed_everything

VOCAB, CLASSES, LENGTH, PAD = 11, 5, 6, 0


class TinyTagger(nn.Module):
    """Embedding -> Linear -> ReLU -> Dropout -> Linear, applied per position."""

    def __init__(self, dropout: float = 0.0, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.hidden = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(dim, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)  # (B, T, dim)
        h = self.drop(torch.relu(self.hidden(h)))  # (B, T, dim)
        return self.out(h)  # (B, T, CLASSES)


def make_split(n: int, seed: int) -> dict[str, torch.Tensor]:
    """n sequences with their targets (-100 at padding)."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, VOCAB, (n, LENGTH), generator=gen)  # (n, T)
    lengths = torch.randint(1, LENGTH + 1, (n,), generator=gen)  # (n,)
    pad = torch.arange(LENGTH)[None, :] >= lengths[:, None]  # (n, T)
    tokens[pad] = PAD
    targets = tokens % CLASSES  # (n, T)
    noise = torch.rand(n, LENGTH, generator=gen) < 0.2
    targets[noise] = torch.randint(0, CLASSES, (int(noise.sum()),), generator=gen)
    targets[pad] = -100
    return {"tokens": tokens, "targets": targets}


class TinyData:
    """TrainData over `make_split`; batches are fixed-size global batches of a seeded shuffle."""

    def __init__(self, n: int = 96, batch_size: int = 8, seed: int = 0) -> None:
        self.split = make_split(n, seed=1234)
        self.n, self.batch_size, self.seed = n, batch_size, seed

    def batches(self, epoch: int) -> list[list[int]]:
        return shuffled_batches(self.n, self.batch_size, self.seed, epoch)

    def collate(self, indices: list[int]) -> dict[str, torch.Tensor]:
        idx = torch.tensor(indices)
        return {k: v[idx] for k, v in self.split.items()}

    def num_tokens(self, batch: dict) -> int:
        return int((batch["tokens"] != PAD).sum())


def step_fn(model: nn.Module, batch: dict) -> StepOutput:
    """Mean token cross-entropy over non-pad targets, weighted by their count."""
    logits = model(batch["tokens"])  # (B, T, C)
    targets = batch["targets"]  # (B, T)
    mask = targets != -100  # (B, T)
    loss = F.cross_entropy(logits[mask], targets[mask])
    acc = (logits[mask].argmax(-1) == targets[mask]).float().mean().item()
    return StepOutput(loss=loss, weight=float(mask.sum()), metrics={"acc": acc})


def make_evaluate(n: int = 48):
    """evaluate(model) -> {"val_loss", "val_acc"} on a fixed held-out split."""
    split = make_split(n, seed=999)

    def evaluate(model: nn.Module) -> dict[str, float]:
        device = next(model.parameters()).device
        tokens, targets = split["tokens"].to(device), split["targets"].to(device)  # (n, T)
        logits = model(tokens)  # (n, T, C)
        mask = targets != -100  # (n, T)
        loss = F.cross_entropy(logits[mask].float(), targets[mask])
        acc = (logits[mask].argmax(-1) == targets[mask]).float().mean()
        return {"val_loss": float(loss), "val_acc": float(acc)}

    return evaluate


class SlowStep:
    """step_fn that sleeps first, so a subprocess run lasts long enough to be killed mid-way."""

    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def __call__(self, model: nn.Module, batch: dict) -> StepOutput:
        time.sleep(self.sleep_s)
        return step_fn(model, batch)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("overrides", nargs="*", help="TrainConfig key=value")
    args = parser.parse_intermixed_args(argv)
    base = TrainConfig(
        epochs=3,
        batch_size=8,
        lr=3e-2,
        warmup_steps=3,
        log_every=2,
        checkpoint_every=5,
        precision="fp32",
        tensorboard=False,
        num_threads=1,
    )
    cfg = apply_overrides(base, parse_key_values(args.overrides))
    seed_everything(0)  # model init; the Trainer seeds training with cfg.seed (+ rank)
    model = TinyTagger(dropout=args.dropout)
    data = TinyData(batch_size=cfg.batch_size, seed=cfg.seed)
    step = SlowStep(args.sleep) if args.sleep else step_fn
    trainer = Trainer(model, cfg, args.run_dir, data, step, evaluate=make_evaluate())
    summary = trainer.fit(resume=args.resume)
    print("SUMMARY " + json.dumps(summary), file=sys.stdout, flush=True)


if __name__ == "__main__":
    main()
