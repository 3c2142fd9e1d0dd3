"""Masked-character pretraining of a TextClassifier's encoder before it is fine-tuned.

The encoder (embeddings, positions, blocks, final norm) learns to fill in masked characters of
unlabelled text (BERT's masked LM, Devlin et al. 2019 §3.1: 15% of the real characters chosen,
80% of them replaced by ``<mask>``, 10% by a random character, 10% kept). The MLM head is
BERT's: dense, GELU, LayerNorm, then a decoder tied to the character embeddings plus a bias;
it is dropped afterwards, and the n-gram bag and the classification head start fresh for
fine-tuning. Runs in fp32, a fixed number of steps, AdamW with warmup and cosine decay.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.data import CharTokenizer, LengthBucketSampler
from attnlab.data.buckets import pad_batch
from attnlab.data.char_tokenizer import CLS_ID, MASK_ID, PAD_ID, UNK_ID
from attnlab.data.mlm import mask_tokens
from attnlab.models.classifier import TextClassifier
from attnlab.train.schedules import lr_factor


class CharMLMHead(nn.Module):
    """hidden (N, D) -> character logits (N, V), the decoder tied to the input embeddings."""

    def __init__(self, embed: nn.Embedding) -> None:
        super().__init__()
        D = embed.embedding_dim
        self.dense = nn.Linear(D, D)
        self.norm = nn.LayerNorm(D)
        self.embed = embed  # shared, not copied: the decoder is the embedding matrix
        self.bias = nn.Parameter(torch.zeros(embed.num_embeddings))

    def forward(self, h: Tensor) -> Tensor:
        x = self.norm(F.gelu(self.dense(h)))  # (N, D)
        return F.linear(x, self.embed.weight, self.bias)  # (N, V)


def mlm_loss(
    model: TextClassifier,
    head: CharMLMHead,
    ids: Tensor,
    lengths: Tensor,
    vocab_size: int,
    generator: torch.Generator,
    mask_prob: float,
) -> Tensor:
    """Mean cross-entropy over the chosen characters of one right-padded batch (B, T)."""
    corrupted, selected, targets = mask_tokens(
        ids, lengths, (PAD_ID, UNK_ID, CLS_ID, MASK_ID), MASK_ID, vocab_size, mask_prob,
        generator,
    )  # fmt: skip
    h, _, _ = model.encode(corrupted, lengths)  # (B, T, D)
    return F.cross_entropy(head(h[selected]), targets)  # over (N,) chosen positions


def pretrain_encoder(
    model: TextClassifier,
    texts: Sequence[str],
    tokenizer: CharTokenizer,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    max_len: int,
    mask_prob: float,
    seed: int,
    device: str,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Train ``model``'s encoder for ``steps`` MLM steps on ``texts``; return a summary."""
    sequences = [tokenizer.encode(t, max_len) for t in texts]
    sequences = [s for s in sequences if len(s) >= 2]
    sampler = LengthBucketSampler([len(s) for s in sequences], batch_size, shuffle=True, seed=seed)
    head = CharMLMHead(model.embed).to(device)
    params = list({id(p): p for p in [*model.parameters(), *head.parameters()]}.values())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, round(0.06 * steps))
    generator = torch.Generator().manual_seed(seed)
    model.train()
    head.train()
    losses: list[float] = []
    step, epoch, started = 0, 0, time.perf_counter()
    every = max(1, steps // 10)
    while step < steps:
        for batch in sampler.batches(epoch):
            if step == steps:
                break
            step += 1
            for group in opt.param_groups:
                group["lr"] = lr * lr_factor(
                    step, schedule="cosine", total_steps=steps, warmup_steps=warmup
                )
            ids, lengths = pad_batch([sequences[i] for i in batch], PAD_ID)  # (B, T), (B,)
            loss = mlm_loss(model, head, ids.to(device), lengths.to(device),
                            tokenizer.vocab_size, generator, mask_prob)  # fmt: skip
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            losses.append(loss.item())
            if step % every == 0 or step == steps:
                recent = losses[-every:]
                log(
                    f"pretraining step {step}/{steps}: masked-character loss "
                    f"{sum(recent) / len(recent):.3f} ({time.perf_counter() - started:.0f} s)"
                )
        epoch += 1
    window = max(1, min(100, len(losses) // 10))
    return {
        "steps": steps,
        "texts": len(sequences),
        "epochs": round(step * batch_size / max(1, len(sequences)), 2),
        "loss_first": sum(losses[:window]) / window,
        "loss_last": sum(losses[-window:]) / window,
        "seconds": round(time.perf_counter() - started, 1),
        "precision": "fp32",
    }
