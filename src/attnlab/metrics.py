"""Classification metrics: accuracy, per-class precision/recall/F1, macro-F1, confusion matrix."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def confusion_matrix(y_true: Sequence[int], y_pred: Sequence[int], n_classes: int) -> np.ndarray:
    """Counts (C, C): row = true class, column = predicted class."""
    matrix = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(matrix, (np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)), 1)
    return matrix


def classification_report(
    y_true: Sequence[int], y_pred: Sequence[int], labels: Sequence[str]
) -> dict:
    """Accuracy, macro-F1 and per-class precision / recall / F1 / support, as plain floats.

    A class never predicted has precision 0 (and so F1 0), as in scikit-learn's zero_division=0.
    """
    matrix = confusion_matrix(y_true, y_pred, len(labels))
    tp = np.diag(matrix).astype(np.float64)
    predicted = matrix.sum(axis=0).astype(np.float64)
    support = matrix.sum(axis=1).astype(np.float64)
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    recall = np.divide(tp, support, out=np.zeros_like(tp), where=support > 0)
    denom = precision + recall
    f1 = np.divide(2 * precision * recall, denom, out=np.zeros_like(tp), where=denom > 0)
    total = matrix.sum()
    return {
        "accuracy": float(tp.sum() / total) if total else 0.0,
        "macro_f1": float(f1.mean()) if len(labels) else 0.0,
        "per_class": {
            label: {
                "precision": float(precision[i]),
                "recall": float(recall[i]),
                "f1": float(f1[i]),
                "support": int(support[i]),
            }
            for i, label in enumerate(labels)
        },
        "confusion_matrix": matrix.tolist(),
        "labels": list(labels),
        "n": int(total),
    }


def format_report(report: dict) -> str:
    """A plain-text table of a :func:`classification_report` for the terminal."""
    labels = report["labels"]
    width = max(12, *(len(label) + 2 for label in labels))
    lines = [f"{'class':<{width}}precision  recall     f1  support"]
    for label in labels:
        row = report["per_class"][label]
        lines.append(
            f"{label:<{width}}{row['precision']:9.4f}{row['recall']:8.4f}"
            f"{row['f1']:7.4f}{row['support']:9d}"
        )
    lines.append(
        f"accuracy {report['accuracy']:.4f}   macro-F1 {report['macro_f1']:.4f}   n = {report['n']}"
    )
    lines.append("confusion matrix (rows = true, columns = predicted):")
    lines.append(" " * width + "".join(f"{label[:10]:>11}" for label in labels))
    for label, row in zip(labels, report["confusion_matrix"]):
        lines.append(f"{label:<{width}}" + "".join(f"{v:11d}" for v in row))
    return "\n".join(lines)
