"""The data contract of the training loop: TrainData and StepOutput."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


class TrainData(Protocol):
    """What `Trainer` needs from a dataset: global index batches and a collate function.

    `num_tokens(batch)` is optional; without it tokens/s counts items.
    """

    def batches(self, epoch: int) -> list[list[int]]:
        """GLOBAL micro-batches of dataset indices; deterministic given (seed, epoch)."""
        ...

    def collate(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """Turn a list of dataset indices into a dict of batched tensors."""
        ...


@dataclass
class StepOutput:
    """What a step function returns for one micro-batch.

    `loss` is the MEAN over `weight` units (items, or non-pad target tokens); the engine
    backpropagates `loss * weight` and divides by the total weight of the optimizer step, so
    the update equals the mean over the whole global batch. `metrics` are weight-averaged in logs
    and must have the same keys for every micro-batch (ranks sum them key by key).
    """

    loss: torch.Tensor
    weight: float
    metrics: dict[str, float] = field(default_factory=dict)
