"""Layer-wise lr decay (attnlab.finetune.layerwise_lr): the factors by hand for a small BERT
classifier, and one AdamW step over the scaled groups against separate optimizers per layer."""

from __future__ import annotations

import random

import pytest
import torch

from attnlab.errors import UserError
from attnlab.finetune.layerwise_lr import bert_stages, depths, lr_scales, scaled_groups
from attnlab.models.bert import BertClassifier, BertConfig


def _model(n_layers: int) -> BertClassifier:
    cfg = BertConfig(vocab_size=40, d_model=8, n_layers=n_layers, n_heads=2, d_ff=16, context=16)
    return BertClassifier(cfg, 2, "mean").double()


def _expected_depth(name: str, n_layers: int) -> int:
    """By hand from the parameter's name: head and pooler 0, block i L - i, embeddings L + 1."""
    if name.startswith("bert.embeddings."):
        return n_layers + 1
    if name.startswith("bert.encoder.blocks."):
        return n_layers - int(name.split(".")[3])
    return 0


def test_depths_and_scales_by_hand():
    n_layers = random.randint(1, 4)
    model = _model(n_layers)
    decay = random.uniform(0.5, 0.95)
    got_depth = depths(bert_stages(model), model)
    scales = lr_scales(bert_stages(model), model, decay)
    named = dict(model.named_parameters())
    assert set(got_depth) == {id(p) for p in named.values()}
    for name, p in named.items():
        assert got_depth[id(p)] == _expected_depth(name, n_layers), name
        assert scales[id(p)] == pytest.approx(decay ** _expected_depth(name, n_layers), rel=1e-15)


def test_frozen_parameters_get_no_group():
    model = _model(2)
    model.bert.embeddings.requires_grad_(False)
    scales = lr_scales(bert_stages(model), model, 0.8)
    assert not {id(p) for p in model.bert.embeddings.parameters()} & set(scales)
    assert len(scales) == sum(p.requires_grad for p in model.parameters())


def test_bad_decay_and_shared_stage_refused():
    model = _model(2)
    with pytest.raises(UserError):
        lr_scales(bert_stages(model), model, 0.0)
    with pytest.raises(UserError):
        depths([model.bert.encoder.blocks[0], model.bert.encoder.blocks[0]], model)


def test_one_adamw_step_equals_an_optimizer_per_layer():
    torch.manual_seed(random.randint(0, 10**6))
    n_layers, lr, decay = 3, 1e-2, random.uniform(0.5, 0.95)
    model = _model(n_layers)
    ids = torch.randint(2, 40, (4, 9))
    lengths = torch.tensor([9, 7, 5, 3])
    labels = torch.tensor([0, 1, 1, 0])
    loss = torch.nn.functional.cross_entropy(model(ids, lengths), labels)
    loss.backward()
    for p in model.parameters():  # the pooler is unused under mean pooling: give it a gradient too
        if p.grad is None:
            p.grad = torch.randn_like(p)
    named = dict(model.named_parameters())
    decayed = [p for n, p in named.items() if p.ndim >= 2]
    plain = [p for n, p in named.items() if p.ndim < 2]
    groups = [{"params": decayed, "weight_decay": 0.1}, {"params": plain, "weight_decay": 0.0}]
    scaled = scaled_groups(groups, lr_scales(bert_stages(model), model, decay), lr)
    assert sorted(id(p) for g in scaled for p in g["params"]) == sorted(
        id(p) for p in named.values()
    )
    refs = {}
    for name, p in named.items():  # the oracle: each tensor alone, at its rate by hand
        copy = p.detach().clone().requires_grad_()
        copy.grad = p.grad.clone()
        rate = lr * decay ** _expected_depth(name, n_layers)
        refs[name] = (
            copy,
            torch.optim.AdamW([copy], lr=rate, weight_decay=0.1 if p.ndim >= 2 else 0),
        )
    torch.optim.AdamW(scaled, lr=123.0).step()  # every group carries its own lr
    for name, (copy, opt) in refs.items():
        opt.step()
        torch.testing.assert_close(named[name].detach(), copy.detach(), rtol=0, atol=1e-15)
