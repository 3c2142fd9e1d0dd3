"""AdamW with decoupled weight decay and the usual no-decay parameter groups."""

from __future__ import annotations

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split trainable params into a decayed group and a no-decay group.

    Decayed: tensors with ndim >= 2 (Linear/attention/conv weights). Not decayed: biases and
    norm gains (ndim < 2), every nn.Embedding weight (also when tied to an output layer), and
    any name listed by an optional `model.no_weight_decay()` (e.g. a ViT's pos_embed, cls_token).
    """
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    extra = model.no_weight_decay() if hasattr(model, "no_weight_decay") else set()
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        skip = p.ndim < 2 or id(p) in embedding_ids or name in extra
        (no_decay if skip else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def build_optimizer(
    model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float]
) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019) over `param_groups(model, weight_decay)`."""
    groups = param_groups(model, weight_decay)
    if not groups:
        raise ValueError("model has no trainable parameters (all have requires_grad=False)")
    return torch.optim.AdamW(groups, lr=lr, betas=betas)
