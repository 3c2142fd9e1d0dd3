"""Train/val/test splits: stratified and deterministic, saved with a corpus fingerprint."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from collections.abc import Hashable, Sequence

import numpy as np

from attnlab.data.corpus import LabeledCorpus
from attnlab.data.errors import DataError
from attnlab.data.io import read_json, write_json
from attnlab.data.tabular import load_labeled_file
from attnlab.errors import UserError

SPLIT_NAMES = ("train", "val", "test")
_FORMAT = "attnlab.split"


def stratified_split(
    labels: Sequence[str], ratios: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0
) -> dict[str, list[int]]:
    """Split example indices into train/val/test so each class keeps the given ratios.

    Per class (classes in sorted order), the class's indices are shuffled with a generator seeded
    by `seed`; the val and test shares are round(n * ratio) of them and train gets the rest, so a
    class too small for a val or test share stays in train. Each list is sorted ascending. The same
    labels, ratios and seed always give the same split.
    """
    if len(ratios) != len(SPLIT_NAMES):
        raise UserError(f"ratios must give (train, val, test) shares, got {tuple(ratios)}")
    if any(r < 0 for r in ratios) or not math.isclose(sum(ratios), 1.0, abs_tol=1e-6):
        raise UserError(f"ratios must be non-negative and sum to 1, got {tuple(ratios)}")
    if not labels:
        raise UserError("cannot split an empty corpus")
    rng = np.random.default_rng(seed)
    by_class: dict[str, list[int]] = {}
    for index, label in enumerate(labels):
        by_class.setdefault(label, []).append(index)
    split: dict[str, list[int]] = {name: [] for name in SPLIT_NAMES}
    for label in sorted(by_class):
        members = np.asarray(by_class[label])[rng.permutation(len(by_class[label]))]
        n_val = math.floor(len(members) * ratios[1] + 0.5)
        n_test = min(math.floor(len(members) * ratios[2] + 0.5), len(members) - n_val)
        split["val"].extend(members[:n_val].tolist())
        split["test"].extend(members[n_val : n_val + n_test].tolist())
        split["train"].extend(members[n_val + n_test :].tolist())
    return {name: sorted(indices) for name, indices in split.items()}


def stratified_sample(labels: Sequence[Hashable], n: int, seed: int) -> list[int]:
    """Sorted positions of a random ``n`` of ``labels``, each class in its share (at least
    one); every position when ``n`` is 0 or at least their number."""
    if not n or n >= len(labels):
        return list(range(len(labels)))
    rng = random.Random(seed)
    by_label: dict[Hashable, list[int]] = {}
    for i, label in enumerate(labels):
        by_label.setdefault(label, []).append(i)
    keep = []
    for label in sorted(by_label):  # type: ignore[type-var]
        members = by_label[label]
        keep += rng.sample(members, max(1, round(n * len(members) / len(labels))))
    return sorted(keep)


def corpus_fingerprint(texts: Sequence[str]) -> str:
    """SHA-256 of the texts in order, to tell whether a saved split belongs to a corpus."""
    payload = json.dumps(list(texts), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def save_split(
    path: str | os.PathLike[str], split: dict[str, list[int]], texts: Sequence[str]
) -> None:
    """Write the split's indices and the corpus fingerprint to a JSON file."""
    write_json(
        path,
        {
            "format": _FORMAT,
            "version": 1,
            "num_examples": len(texts),
            "texts_sha256": corpus_fingerprint(texts),
            "indices": {name: [int(i) for i in indices] for name, indices in split.items()},
        },
    )


def load_split(path: str | os.PathLike[str], texts: Sequence[str]) -> dict[str, list[int]]:
    """Read a split saved by `save_split`, refusing it if it was made for a different corpus."""
    data = read_json(path, "split")
    fix = "use the data the run was trained on (restore the file), or train a new run"
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise DataError(path, "not an attnlab split file", fix)
    try:
        num_examples, sha, indices = data["num_examples"], data["texts_sha256"], data["indices"]
    except KeyError as err:
        raise DataError(path, f"split file lacks the {err.args[0]!r} entry", fix) from None
    if num_examples != len(texts) or sha != corpus_fingerprint(texts):
        raise DataError(
            path,
            f"split was made for a different corpus ({num_examples} texts, sha256 {sha[:12]}…) "
            f"than the one given ({len(texts)} texts, sha256 {corpus_fingerprint(texts)[:12]}…)",
            fix,
        )
    for name, members in indices.items():
        if not all(isinstance(i, int) and 0 <= i < len(texts) for i in members):
            raise DataError(path, f"split {name!r} has indices outside 0..{len(texts) - 1}", fix)
    return {name: list(members) for name, members in indices.items()}


def check_labels(
    train_labels: Sequence[str],
    other_labels: Sequence[str],
    name: str,
    origins: Sequence[str] | None = None,
) -> None:
    """Raise if `other_labels` (the `name` split) has a label that never occurs in training.

    `origins`, parallel to `other_labels`, gives "file:line" so the error can point at a row.
    """
    known = set(train_labels)
    unseen: dict[str, int] = {}
    for position, label in enumerate(other_labels):
        if label not in known and label not in unseen:
            unseen[label] = position
    if unseen:
        where = [
            f"{label!r} ({origins[position]})" if origins is not None else repr(label)
            for label, position in unseen.items()
        ]
        noun = "label" if len(unseen) == 1 else "labels"
        raise UserError(
            f"{noun} {', '.join(where)} seen only in {name}, never in train. Fix: add training "
            f"examples with {'that label' if len(unseen) == 1 else 'those labels'} or remove "
            f"those rows from {name}"
        )


def load_split_files(
    train: str | os.PathLike[str],
    val: str | os.PathLike[str] | None = None,
    test: str | os.PathLike[str] | None = None,
    text_col: str = "text",
    label_col: str = "label",
    fmt: str | None = None,
) -> tuple[LabeledCorpus, dict[str, list[int]]]:
    """Load user-given train (and optional val/test) files as one corpus plus the split indices.

    Every label in val or test must also occur in train; the error names the file and line.
    """
    paths = {"train": train, "val": val, "test": test}
    parts = {
        name: load_labeled_file(path, text_col, label_col, fmt)
        for name, path in paths.items()
        if path is not None
    }
    for name, part in parts.items():
        if name != "train":
            check_labels(parts["train"].labels, part.labels, name, part.origins)
    texts: list[str] = []
    labels: list[str] = []
    origins: list[str] = []
    split: dict[str, list[int]] = {name: [] for name in SPLIT_NAMES}
    for name, part in parts.items():
        split[name] = list(range(len(texts), len(texts) + len(part)))
        texts += part.texts
        labels += part.labels
        origins += part.origins or []
    corpus = LabeledCorpus(
        texts,
        labels,
        source=" + ".join(part.source for part in parts.values()),
        stats={name: part.stats for name, part in parts.items()},
        origins=origins,
    )
    return corpus, split
