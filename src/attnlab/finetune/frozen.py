"""Training only the top blocks: the rest frozen, and its output computed once and kept.

With ``freeze_lower`` the embeddings and the lowest blocks get no gradient, so they cost a
forward pass only; ``frozen_states`` goes further and runs them once over every text, keeping
their output (:class:`~attnlab.data.states.StateData`), so a training step runs only the
blocks that learn. In eval mode their output is what a step would compute without dropout.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from attnlab.data.buckets import LengthBucketSampler
from attnlab.data.classification import ClassificationData
from attnlab.data.states import STORE_DTYPE, StateData


def freeze_lower(model: nn.Module, n_layers: int) -> None:
    """No gradient for ``model.bert``'s embeddings and its ``n_layers`` lowest blocks (0: all
    train). Activations below the first trainable block then carry no autograd graph."""
    if n_layers <= 0:
        return
    model.bert.embeddings.requires_grad_(False)
    for block in list(model.bert.encoder.blocks)[:n_layers]:
        block.requires_grad_(False)


def in_order(data: ClassificationData, batch_size: int) -> ClassificationData:
    """The same texts and labels batched for a pass in length order (no shuffling)."""
    sampler = LengthBucketSampler([len(s) for s in data.sequences], batch_size, shuffle=False)
    return ClassificationData(data.sequences, data.labels, sampler, pad_id=data.pad_id)


@torch.no_grad()
def frozen_states(
    model: nn.Module,
    data: ClassificationData,
    start: int,
    batch_size: int,
    shuffle: bool,
    seed: int,
    device: str | torch.device = "cpu",
    desc: str = "frozen blocks",
) -> StateData:
    """The output of ``model.bert``'s embeddings and blocks below ``start`` (eval mode) for
    every text of ``data``, kept as :class:`StateData` batched by ``batch_size`` (shuffled with
    ``seed`` when ``shuffle``: the batches ``data``'s own sampler of that size would draw)."""
    was_training = model.training
    model.eval()
    states: list[torch.Tensor] = [torch.empty(0)] * len(data)
    for indices in tqdm(data.batches(0), desc=desc, unit="batch", file=sys.stderr, leave=False):
        batch = data.collate(indices)
        ids, lengths = batch["input_ids"].to(device), batch["lengths"].to(device)
        x = model.bert(ids, lengths, stop=start)  # (B, T, D)
        for row, i in enumerate(indices):
            states[i] = x[row, : int(lengths[row])].to(STORE_DTYPE).cpu()  # (T_i, D)
    model.train(was_training)
    sampler = LengthBucketSampler([s.shape[0] for s in states], batch_size, shuffle, seed)
    return StateData(states, data.labels, sampler, start)


def subset(
    data: ClassificationData | StateData,
    keep: Sequence[int],
    batch_size: int,
    shuffle: bool,
    seed: int,
) -> ClassificationData | StateData:
    """The examples of ``data`` at ``keep`` (ids or kept states), batched by ``batch_size``."""
    labels = [data.labels[i] for i in keep]
    if isinstance(data, StateData):
        states = [data.states[i] for i in keep]
        sampler = LengthBucketSampler([s.shape[0] for s in states], batch_size, shuffle, seed)
        return StateData(states, labels, sampler, data.start)
    seqs = [data.sequences[i] for i in keep]
    sampler = LengthBucketSampler([len(s) for s in seqs], batch_size, shuffle, seed)
    return ClassificationData(seqs, labels, sampler, pad_id=data.pad_id)
