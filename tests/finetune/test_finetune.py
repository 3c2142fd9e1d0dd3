"""finetune/, each function alone: the probe against scikit-learn's logistic regression, label
cleaning's out-of-fold confidence and its choice, the pooled features against the model's own
forward, and the kept frozen states' subsets and joins."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from attnlab.data.buckets import LengthBucketSampler
from attnlab.data.classification import ClassificationData
from attnlab.finetune.cleaning import FOLDS, contradicted, out_of_fold_confidence
from attnlab.finetune.features import pooled_features
from attnlab.finetune.frozen import concat, frozen_states, subset
from attnlab.finetune.probe import fit_probe, logistic_regression
from attnlab.models.bert import BertConfig
from attnlab.models.zoo_mlm import encoder_classifier


def blobs(n: int, d: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``classes`` overlapping Gaussian blobs: features (n, d) float64, labels (n,)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % classes  # (n,)
    centres = torch.randn(classes, d, generator=g, dtype=torch.float64)
    return centres[y] + torch.randn(n, d, generator=g, dtype=torch.float64), y


@pytest.mark.parametrize("classes", [3, 8])
def test_the_probe_is_scikit_learns_l2_logistic_regression(seed, classes):
    """Mean cross-entropy + λ·||W||² (ours) is scikit-learn's C·Σ cross-entropy + ½||W||² with
    C = 1 / (2λN), the intercept unpenalised in both; the fitted probabilities agree to 5e-4
    (seeds 0-19 at 3 and 8 classes: at most 6.8e-5, our objective at most 2.8e-9 above
    scikit-learn's; λ doubled moves them by 4.1e-2 or more: docs/results/probe_tolerance.md)."""
    x, y = blobs(240, 6, classes, seed)
    wd = 1e-2
    head = logistic_regression(x, y, classes, wd)
    ref = LogisticRegression(C=1 / (2 * wd * len(y)), tol=1e-12, max_iter=10_000)
    ref.fit(x.numpy(), y.numpy())
    with torch.no_grad():
        ours = torch.softmax(head(x), -1).numpy()  # (N, C)
    np.testing.assert_allclose(ours, ref.predict_proba(x.numpy()), atol=5e-4, err_msg=f"{seed}")


def test_fit_probe_sets_the_head_to_the_fit(seed):
    x, y = blobs(90, 5, 3, seed)
    head = torch.nn.Linear(5, 3)
    report = fit_probe(head, x.float(), y, 1e-3)
    fitted = logistic_regression(x.float(), y, 3, 1e-3)
    assert torch.allclose(head.weight, fitted.weight.float())
    with torch.no_grad():
        accuracy = (head(x.float()).argmax(-1) == y).double().mean().item()
    assert report["n"] == 90 and report["train_accuracy"] == pytest.approx(accuracy)


def test_out_of_fold_confidence_never_reads_a_text_s_own_label(seed):
    """Each text's p comes from a fit on the other folds: changing one text's label moves only
    the confidences of the texts outside its fold (its own fold's fit never saw it)."""
    x, y = blobs(100, 4, 2, seed)
    p = out_of_fold_confidence(x, y, 2, 1e-3, seed)
    flipped = y.clone()
    flipped[7] = 1 - flipped[7]
    q = out_of_fold_confidence(x, flipped, 2, 1e-3, seed)
    order = torch.randperm(100, generator=torch.Generator().manual_seed(seed))
    fold = next(order[k::FOLDS] for k in range(FOLDS) if 7 in order[k::FOLDS].tolist())
    same = [i for i in fold.tolist() if i != 7]
    assert torch.allclose(p[same], q[same], atol=0)  # the fold's fit did not change
    assert torch.allclose(p[7] + q[7], torch.tensor(1.0, dtype=torch.float64))  # two classes


def test_contradicted_lists_the_least_supported_first_among_the_candidates():
    p = torch.tensor([0.9, 0.05, 0.3, 0.1, 0.01], dtype=torch.float64)
    assert contradicted(p, 0.2, 5) == [4, 1, 3]
    assert contradicted(p, 0.2, 4) == [1, 3]  # the last one is no candidate


def tiny_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=50, d_model=16, n_layers=3, n_heads=2, d_ff=32, context=32,
                     dropout=0.0, attn_dropout=0.0)  # fmt: skip
    return encoder_classifier(cfg, 3, "mean", "bert", 0).eval()


def tiny_data(seed: int, n: int = 11) -> ClassificationData:
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(4, 50, (int(k),), generator=g).tolist()
            for k in torch.randint(3, 20, (n,), generator=g)]  # fmt: skip
    labels = (torch.arange(n) % 3).tolist()
    sampler = LengthBucketSampler([len(s) for s in seqs], 4, shuffle=False)
    return ClassificationData(seqs, labels, sampler, pad_id=0)


def test_pooled_features_are_the_model_s_features_of_each_text_alone(seed):
    model, data = tiny_model(seed), tiny_data(seed)
    x, y = pooled_features(model, data)
    for i, seq in enumerate(data.sequences):
        ids = torch.tensor([seq])
        alone = model.features(ids, torch.tensor([len(seq)]))[0]  # (D,)
        assert torch.allclose(x[i], alone, atol=1e-5), (seed, i)
    assert y.tolist() == data.labels


def test_pooled_features_under_bf16_are_the_autocast_features_of_each_text(seed):
    """With a dtype the pass runs under its autocast: each row is the model's own bf16 features
    of that text (returned as float32), and not float32's (bf16 rounds them)."""
    model, data = tiny_model(seed), tiny_data(seed)
    x, _ = pooled_features(model, data, dtype=torch.bfloat16)
    x32, _ = pooled_features(model, data)
    assert x.dtype == torch.float32
    for i, seq in enumerate(data.sequences):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            alone = model.features(torch.tensor([seq]), torch.tensor([len(seq)]))[0].float()
        assert torch.allclose(x[i], alone, atol=2e-2), (seed, i)
    assert not torch.equal(x, x32), seed


def test_subsets_and_joins_of_kept_states_keep_each_text_s_states(seed):
    model, data = tiny_model(seed), tiny_data(seed)
    states = frozen_states(model, data, 2, 4, False, 0)
    keep = [9, 0, 4]
    part = subset(states, keep, 2, True, seed)
    assert part.labels == [data.labels[i] for i in keep]
    assert all(torch.equal(a, states.states[i]) for a, i in zip(part.states, keep))
    joined = concat(part, states, 4, False, 0)
    assert len(joined) == 3 + len(states) and joined.labels[3:] == states.labels
    with pytest.raises(ValueError, match="do not mix"):
        concat(part, data, 4, False, 0)
