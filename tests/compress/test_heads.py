"""Head pruning: the head mask gates heads, its gradient is the loss's derivative, physical
removal gives the masked model's outputs with smaller layers, and pruned configs rebuild."""

from __future__ import annotations

import pytest
import torch

from attnlab.compress.heads import (
    attention_layers,
    head_importance,
    head_mask,
    heads_to_remove,
    prune_heads,
)
from attnlab.models.bert import BertConfig, BertModel
from attnlab.models.classifier import ClassifierConfig, TextClassifier

F64 = torch.float64


def classifier(heads: tuple[int, ...] = (), **kw) -> TextClassifier:
    cfg = ClassifierConfig(
        vocab_size=30, n_classes=3, d_model=24, n_heads=4, n_layers=3, d_ff=32, dropout=0.0,
        attn_dropout=0.0, emb_dropout=0.0, heads_per_layer=heads, **kw,
    )  # fmt: skip
    return TextClassifier(cfg).double().eval()


def batch(B: int = 5, T: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.randint(1, T + 1, (B,))
    lengths[0] = T
    ids = torch.randint(3, 30, (B, T)).masked_fill(torch.arange(T)[None] >= lengths[:, None], 0)
    return ids, lengths


@pytest.mark.parametrize("norm_position", ["pre", "post"])
@pytest.mark.parametrize("pos", ["sinusoidal", "rope"])
def test_removed_heads_equal_the_masked_model(norm_position, pos):
    model = classifier(norm_position=norm_position, pos=pos)
    with torch.no_grad():  # trained-looking biases, so a forgotten bias would show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ids, lengths = batch()
    remove = [[0, 2], [], [1, 2, 3]]
    mask = torch.ones(3, 4, dtype=F64)
    for layer, heads in enumerate(remove):
        mask[layer, heads] = 0.0
    with head_mask(model, mask), torch.no_grad():
        masked = model(ids, lengths)
    before = sum(p.numel() for p in model.parameters())
    kept = prune_heads(model, remove)
    assert kept == [2, 4, 1]
    with torch.no_grad():
        pruned = model(ids, lengths)
    torch.testing.assert_close(pruned, masked, rtol=0, atol=1e-12)
    removed = 5 * (3 * 6 * 24 + 3 * 6 + 24 * 6)  # 5 heads: q/k/v rows and out_proj columns
    assert before - sum(p.numel() for p in model.parameters()) == removed
    assert [a.q_proj.weight.shape[0] for a in attention_layers(model)] == [12, 24, 6]
    assert [a.kv_proj.weight.shape[0] for a in attention_layers(model)] == [24, 48, 12]


def test_the_mask_gradient_is_the_derivative_of_the_loss():
    model = classifier()
    ids, lengths = batch()
    labels = torch.randint(0, 3, (ids.shape[0],))

    def loss_fn(m, b):
        return torch.nn.functional.cross_entropy(m(*b[:2]), b[2], reduction="sum")

    importance = head_importance(model, [(ids, lengths, labels)], loss_fn)
    layer, head, eps = 1, 2, 1e-6
    raw = []
    for sign in (1, -1):
        mask = torch.ones(3, 4, dtype=F64)
        mask[layer, head] += sign * eps
        with head_mask(model, mask), torch.no_grad():
            raw.append(loss_fn(model, (ids, lengths, labels)))
    numeric = abs(float(raw[0] - raw[1]) / (2 * eps))
    mask = torch.ones(3, 4, dtype=F64, requires_grad=True)
    with head_mask(model, mask):
        (grad,) = torch.autograd.grad(loss_fn(model, (ids, lengths, labels)), mask)
    assert abs(abs(float(grad[layer, head])) - numeric) < 1e-6 * max(1.0, numeric)
    norm = grad.abs()[layer].norm()
    assert abs(float(importance[layer, head]) - abs(float(grad[layer, head])) / norm) < 1e-6


def test_heads_to_remove_takes_the_least_important_and_keeps_one_per_layer():
    imp = torch.tensor([[0.1, 0.9, 0.2, 0.3], [0.05, 0.01, 0.02, 0.03], [0.5, 0.6, 0.7, 0.8]])
    assert heads_to_remove(imp, 2) == [[], [1, 2], []]
    assert heads_to_remove(imp, 4) == [[0], [1, 2, 3], []]  # layer 1 keeps head 0
    with pytest.raises(ValueError, match="0..9"):
        heads_to_remove(imp, 10)


def test_a_pruned_model_saves_and_rebuilds_from_its_head_counts():
    model = classifier()
    kept = prune_heads(model, [[1], [0, 3], []])
    again = classifier(heads=tuple(kept))
    again.load_state_dict(model.state_dict())  # strict: every shape matches
    ids, lengths = batch()
    torch.testing.assert_close(again(ids, lengths), model(ids, lengths), rtol=0, atol=0)
    with pytest.raises(ValueError, match="3 counts"):
        classifier(heads=(2, 2))


def test_bert_heads_prune_too():
    cfg = BertConfig(vocab_size=40, d_model=24, n_layers=2, n_heads=4, d_ff=32, context=16,
                     dropout=0.0, attn_dropout=0.0)  # fmt: skip
    bert = BertModel(cfg).double().eval()
    ids, lengths = batch()
    mask = torch.ones(2, 4, dtype=F64)
    mask[0, 3] = mask[1, :2] = 0.0
    with head_mask(bert, mask), torch.no_grad():
        masked = bert(ids, lengths)
    kept = prune_heads(bert, [[3], [0, 1]])
    torch.testing.assert_close(bert(ids, lengths), masked, rtol=0, atol=1e-12)
    rebuilt = BertModel(BertConfig(**{**vars(cfg), "heads_per_layer": (3, 2)})).double()
    rebuilt.load_state_dict(bert.state_dict())
    assert kept == [3, 2]
