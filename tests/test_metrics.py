"""Hand-written classification metrics against scikit-learn's."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn import metrics as skm

from attnlab.metrics import classification_report, format_report


@pytest.mark.parametrize("n_classes", [2, 3, 5])
def test_report_matches_sklearn(n_classes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    y_true = rng.integers(0, n_classes, 200)
    y_pred = np.where(rng.random(200) < 0.7, y_true, rng.integers(0, n_classes, 200))
    if n_classes == 5:
        y_pred[y_pred == 4] = 0  # a class that is never predicted: precision 0, no NaN
    labels = [f"c{i}" for i in range(n_classes)]
    report = classification_report(y_true.tolist(), y_pred.tolist(), labels)
    assert report["accuracy"] == pytest.approx(skm.accuracy_score(y_true, y_pred))
    assert report["macro_f1"] == pytest.approx(
        skm.f1_score(y_true, y_pred, average="macro", labels=range(n_classes), zero_division=0)
    )
    p, r, f, s = skm.precision_recall_fscore_support(
        y_true, y_pred, labels=range(n_classes), zero_division=0
    )
    for i, label in enumerate(labels):
        row = report["per_class"][label]
        assert (row["precision"], row["recall"], row["f1"], row["support"]) == pytest.approx(
            (p[i], r[i], f[i], s[i])
        )
    assert (
        report["confusion_matrix"]
        == skm.confusion_matrix(y_true, y_pred, labels=range(n_classes)).tolist()
    )
    text = format_report(report)
    assert "macro-F1" in text and all(label in text for label in labels)
