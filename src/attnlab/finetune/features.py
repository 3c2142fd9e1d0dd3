"""The pooled vectors a classifier's head reads, for every text of a dataset."""

from __future__ import annotations

import contextlib
import sys

import torch
from torch import nn
from tqdm.auto import tqdm

from attnlab.data.classification import ClassificationData
from attnlab.data.states import StateData


@torch.no_grad()
def pooled_features(
    model: nn.Module,
    data: ClassificationData | StateData,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(features (N, D) float32, labels (N,)) of ``model.features`` in eval mode, in dataset
    order, under ``dtype``'s autocast (None: float32); from the kept lower blocks' output when
    ``data`` holds it (:class:`StateData`)."""
    was_training = model.training
    model.eval()
    feats: dict[int, torch.Tensor] = {}
    low = (
        contextlib.nullcontext()
        if dtype is None
        else torch.autocast(torch.device(device).type, dtype=dtype)
    )
    with low:
        for indices in tqdm(data.batches(0), desc="features", unit="batch", file=sys.stderr,
                            leave=False):  # fmt: skip
            batch = {
                k: v.to(device) if torch.is_tensor(v) else v
                for k, v in data.collate(indices).items()
            }
            pooled = model.features(  # (B, D)
                batch.get("input_ids"), batch["lengths"], hidden=batch.get("hidden"),
                start=batch.get("start", 0),
            )  # fmt: skip
            feats.update(zip(indices, pooled.float().cpu()))
    model.train(was_training)
    return torch.stack([feats[i] for i in range(len(data))]), torch.tensor(list(data.labels))
