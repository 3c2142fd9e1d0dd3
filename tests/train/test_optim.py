"""AdamW parameter groups: what gets weight decay."""

from __future__ import annotations

import torch
from torch import nn

from attnlab.train.optim import build_optimizer, param_groups


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.pos = nn.Parameter(torch.zeros(1, 3, 4))
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied output layer
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)

    def no_weight_decay(self) -> set[str]:
        return {"pos"}


def test_decay_only_matrices_that_are_not_embeddings() -> None:
    model = Tied()
    decay, no_decay = param_groups(model, weight_decay=0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {id(p) for p in decay["params"]} == {id(model.proj.weight)}
    expected = {model.embed.weight, model.proj.bias, model.norm.weight, model.norm.bias, model.pos}
    assert {id(p) for p in no_decay["params"]} == {id(p) for p in expected}
    assert len(no_decay["params"]) == len(expected)  # the tied weight appears once


def test_decay_is_decoupled_and_skips_no_decay_group() -> None:
    """With zero gradients AdamW only applies decay: p <- p * (1 - lr * wd) on decayed params."""
    model = Tied()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(model, lr=0.1, weight_decay=0.5, betas=(0.9, 0.98))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    torch.testing.assert_close(model.proj.weight, before["proj.weight"] * (1 - 0.1 * 0.5))
    assert torch.equal(model.embed.weight, before["embed.weight"])
    assert torch.equal(model.norm.weight, before["norm.weight"])
