"""Label cleaning: find the training texts whose label the rest of the data contradicts.

Each text's own label gets a probability from a logistic regression on the frozen encoder's
features fitted on the *other* folds (confident learning, Northcutt et al. 2021): a label the
rest of the data, read by the pretrained encoder, does not support gets a low one.
"""

from __future__ import annotations

import torch

from attnlab.finetune.probe import logistic_regression

FOLDS = 5


def out_of_fold_confidence(
    x: torch.Tensor, y: torch.Tensor, n_classes: int, weight_decay: float, seed: int
) -> torch.Tensor:
    """p(own label) (N,) of each example under a logistic regression fitted on the other
    folds' features ``x`` (N, D) (``FOLDS`` random folds drawn with ``seed``)."""
    n = len(y)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    confidence = torch.empty(n, dtype=torch.float64)
    for k in range(FOLDS):
        held = order[k::FOLDS]
        rest = torch.ones(n, dtype=torch.bool)
        rest[held] = False
        head = logistic_regression(x[rest], y[rest], n_classes, weight_decay)
        with torch.no_grad():
            probs = torch.softmax(head(x[held].double()), dim=-1)  # (n_k, C)
        confidence[held] = probs[torch.arange(len(held)), y[held]]
    return confidence


def contradicted(confidence: torch.Tensor, threshold: float, candidates: int) -> list[int]:
    """Positions among the first ``candidates`` whose confidence is below ``threshold``, the
    least supported first."""
    below = (confidence[:candidates] < threshold).nonzero().flatten().tolist()
    return sorted(below, key=lambda i: float(confidence[i]))
