"""TextClassifier: padding never leaks into attention or pooling, every pooling and position
option runs, and inspection returns well-formed attention and token shares."""

from __future__ import annotations

import pytest
import torch

from attnlab.models.classifier import (
    POOLINGS,
    POSITIONS,
    ClassifierConfig,
    TextClassifier,
    TextClassifierEnsemble,
    build_classifier,
)


def make(pooling: str = "mean", pos: str = "sinusoidal", **kw) -> TextClassifier:
    cfg = ClassifierConfig(
        vocab_size=50,
        n_classes=3,
        d_model=32,
        n_heads=4,
        n_layers=2,
        d_ff=64,
        pooling=pooling,
        pos=pos,
        context=40,
        **kw,
    )
    return TextClassifier(cfg).eval()


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 3, 12])
    ids = torch.randint(4, 50, (3, 12), generator=g)
    ids[:, 0] = 2  # <cls> first, used by cls pooling
    ids[torch.arange(12)[None, :] >= lengths[:, None]] = 0
    return ids, lengths


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("pos", POSITIONS)
def test_padding_changes_nothing(pooling: str, pos: str, seed: int) -> None:
    """Whatever sits in padded positions, and however long the padding, logits are the same."""
    torch.manual_seed(seed)
    extra = {"bigram_buckets": 97} if pos == "sinusoidal" else {}
    if pos in ("learned", "rope"):
        extra["ngram_buckets"] = 101
    model = make(pooling, pos, **extra)
    ids, lengths = batch(seed)
    logits = model(ids, lengths)
    garbage = ids.clone()
    pad = torch.arange(12)[None, :] >= lengths[:, None]
    garbage[pad] = torch.randint(4, 50, (int(pad.sum()),))
    longer = torch.cat([ids, torch.zeros(3, 5, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(garbage, lengths), logits)
    torch.testing.assert_close(model(longer, lengths), logits, atol=1e-5, rtol=1e-5)
    # each row alone, without any padding, gives the same logits as inside the batch
    for i, n in enumerate(lengths.tolist()):
        alone = model(ids[i : i + 1, :n], lengths[i : i + 1])
        torch.testing.assert_close(alone, logits[i : i + 1], atol=1e-5, rtol=1e-5)


def test_mean_and_max_pooling_by_hand(seed: int) -> None:
    torch.manual_seed(seed)
    ids, lengths = batch(seed)
    for pooling in ("mean", "max"):
        model = make(pooling)
        h, mask, _ = model.encode(ids, lengths)
        pooled = model.pool(h, mask)
        for i, n in enumerate(lengths.tolist()):
            real = h[i, :n]
            want = real.mean(0) if pooling == "mean" else real.amax(0)
            torch.testing.assert_close(pooled[i], want)


def test_inspect_attention_and_token_share(seed: int) -> None:
    torch.manual_seed(seed)
    model = make("cls")
    ids, lengths = batch(seed)
    info = model.inspect(ids, lengths)
    assert info["attention"].shape == (2, 3, 4, 12, 12)
    rows = info["attention"].sum(-1)  # every query row of a real token sums to one
    real = (torch.arange(12)[None, :] < lengths[:, None])[None, :, None, :].expand_as(rows)
    torch.testing.assert_close(rows[real], torch.ones(int(real.sum())))
    assert torch.all(info["attention"][..., 3:][:, 1] == 0)  # sample 1 has 3 tokens
    share = info["token_share"]
    torch.testing.assert_close(share.sum(-1), torch.ones(3))
    assert torch.all(share[1, 3:] == 0) and torch.all(share >= 0)
    torch.testing.assert_close(info["logits"], model(ids, lengths))


def test_token_dropout_only_in_training(seed: int) -> None:
    torch.manual_seed(seed)
    model = make(token_dropout=0.5, dropout=0.0, attn_dropout=0.0, emb_dropout=0.0)
    ids, lengths = batch(seed)
    a, b = model(ids, lengths), model(ids, lengths)
    torch.testing.assert_close(a, b)  # eval: deterministic, nothing dropped
    model.train()  # no other dropout left: only token dropout can make two calls differ
    assert not torch.equal(model(ids, lengths), model(ids, lengths))


def test_bad_config_errors() -> None:
    with pytest.raises(ValueError, match="pooling must be one of"):
        make("attention")
    with pytest.raises(ValueError, match="not divisible by n_heads"):
        TextClassifier(ClassifierConfig(vocab_size=10, d_model=30, n_heads=4))
    with pytest.raises(ValueError, match="vocab_size must be set"):
        TextClassifier(ClassifierConfig())
    model = make(pos="learned")
    with pytest.raises(ValueError, match="context=40"):
        model(torch.ones(1, 41, dtype=torch.long), torch.tensor([41]))


@pytest.mark.parametrize("pooling", POOLINGS)
def test_ngram_bag_is_the_mean_over_exactly_the_texts_ngrams(pooling: str, seed: int) -> None:
    """The bag holds every 1..3-gram of the real text once (none touching padding or <cls>), and
    its feature is the mean of their bucket embeddings, computed here from the text by hand."""
    torch.manual_seed(seed)
    model = make(pooling, ngram_buckets=1009, ngram_max=3)
    ids, lengths = batch(seed)
    hashed, valid = model.ngram_ids(ids, lengths)
    start = int(pooling == "cls")
    feats = model.ngram_features(ids, lengths)
    for i, n in enumerate(lengths.tolist()):
        text = ids[i, start:n].tolist()
        grams = [tuple(text[p : p + k]) for k in (1, 2, 3) for p in range(len(text) - k + 1)]
        assert int(valid[i].sum()) == len(grams)
        buckets = hashed[i][valid[i]]
        expected = model.ngram_bag.weight[buckets].mean(0)
        torch.testing.assert_close(feats[i], expected)
    logits = model(ids, lengths)
    assert logits.shape == (3, 3)
    logits.sum().backward()
    assert model.ngram_bag.weight.grad.abs().sum() > 0


def test_ngram_hash_is_position_free() -> None:
    """An n-gram hashes to the same bucket wherever it sits in whichever text."""
    model = make(ngram_buckets=4099, ngram_max=2)
    ids = torch.tensor([[5, 6, 7, 0], [9, 5, 6, 8]])
    hashed, valid = model.ngram_ids(ids, torch.tensor([3, 4]))
    # layout: unigrams at 0..3, bigrams at 4..6; bigram (5, 6) starts at 0 in row 0, 1 in row 1
    assert hashed[0, 4] == hashed[1, 5] and hashed[0, 0] == hashed[1, 1]
    assert hashed[0, 0] != hashed[0, 4]  # a unigram and a bigram starting alike differ
    assert valid.tolist() == [[1, 1, 1, 0, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1]]


def test_ensemble_predicts_the_mean_of_its_members_probabilities(seed: int) -> None:
    """The oracle is each member run alone: the ensemble's log-output is log(mean softmax)."""
    torch.manual_seed(seed)
    ensemble = build_classifier(
        ClassifierConfig(vocab_size=50, n_classes=3, d_model=32, n_heads=4, d_ff=64, members=3)
    ).eval()
    assert isinstance(ensemble, TextClassifierEnsemble) and len(ensemble.members) == 3
    ids, lengths = batch(seed)
    probs = torch.stack([torch.softmax(m(ids, lengths), -1) for m in ensemble.members])  # (M,B,C)
    torch.testing.assert_close(ensemble(ids, lengths).exp(), probs.mean(0))
    torch.testing.assert_close(
        ensemble(ids, lengths, per_member=True),
        torch.stack([m(ids, lengths) for m in ensemble.members]),
    )
    first, second = ensemble.members[0].embed.weight, ensemble.members[1].embed.weight
    assert not torch.equal(first, second)  # members start from different initialisations
    info = ensemble.inspect(ids, lengths, member=2)
    torch.testing.assert_close(info["logits"], ensemble(ids, lengths))
    torch.testing.assert_close(
        info["attention"], ensemble.members[2].inspect(ids, lengths)["attention"]
    )
    with pytest.raises(ValueError, match="member must be in 0..2"):
        ensemble.inspect(ids, lengths, member=3)
    with pytest.raises(ValueError, match="members must be >= 1"):
        build_classifier(ClassifierConfig(vocab_size=50, members=0))
    assert isinstance(build_classifier(ClassifierConfig(vocab_size=50)), TextClassifier)


def test_ensemble_members_learn_from_their_own_loss_only(seed: int) -> None:
    """The training step's gradient for each member is that member's own loss / M."""
    from attnlab.runs.training import build_config
    from attnlab.tasks.classify import TASK

    step = TASK.step(build_config(TASK, None, {"arch": "char", "label_smoothing": "0.1"}))
    torch.manual_seed(seed)
    cfg = ClassifierConfig(vocab_size=50, n_classes=3, d_model=32, n_heads=4, d_ff=64, members=2)
    cfg.dropout = cfg.attn_dropout = cfg.emb_dropout = 0.0
    ensemble = build_classifier(cfg).double()
    ids, lengths = batch(seed)
    labels = torch.tensor([0, 2, 1])
    out = step(ensemble, {"input_ids": ids, "lengths": lengths, "labels": labels})
    out.loss.backward()
    for member in ensemble.members:
        alone = torch.nn.functional.cross_entropy(member(ids, lengths), labels, label_smoothing=0.1)
        grads = torch.autograd.grad(alone / 2, list(member.parameters()), allow_unused=True)
        for p, g in zip(member.parameters(), grads):
            if g is not None:
                torch.testing.assert_close(p.grad, g)
