"""LP-FT's first step: the head fitted on the frozen encoder's features (Kumar et al. 2022).

Fine-tuning from a random head pushes large, random gradients into the pretrained features
before the head has learned anything; starting from the logistic regression on those features
(linear probing, then fine-tuning) distorts them less and keeps more of what the encoder knew,
which shows out of distribution.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def logistic_regression(
    x: torch.Tensor, y: torch.Tensor, n_classes: int, weight_decay: float
) -> nn.Linear:
    """The L2-regularised logistic regression of labels ``y`` (N,) on features ``x`` (N, D): a
    float64 ``nn.Linear`` minimising mean cross-entropy + weight_decay · ||W||² by full-batch
    L-BFGS (convex: the optimum does not depend on the start)."""
    head = nn.Linear(x.shape[1], n_classes).double()
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    x64 = x.double()
    opt = torch.optim.LBFGS(head.parameters(), max_iter=500, tolerance_grad=1e-9,
                            history_size=20, line_search_fn="strong_wolfe")  # fmt: skip

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(head(x64), y)
        loss = loss + weight_decay * head.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return head


def fit_probe(
    head: nn.Linear, x: torch.Tensor, y: torch.Tensor, weight_decay: float
) -> dict[str, Any]:
    """Set ``head`` (D -> C) to the logistic regression of ``y`` (N,) on the frozen features
    ``x`` (N, D); returns the fit's size and training accuracy."""
    fitted = logistic_regression(x, y, head.out_features, weight_decay)
    with torch.no_grad():
        head.weight.copy_(fitted.weight.to(head.weight))
        head.bias.copy_(fitted.bias.to(head.bias))
        accuracy = (fitted(x.double()).argmax(-1) == y).double().mean().item()
    return {"n": len(y), "train_accuracy": accuracy, "weight_decay": weight_decay}
