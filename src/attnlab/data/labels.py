"""`LabelVocab`: string class labels to contiguous integer ids and back; label-count checks."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence

from attnlab.data.errors import DataError
from attnlab.data.io import read_json, write_json
from attnlab.errors import UserError

_FORMAT = "attnlab.label_vocab"
MIN_CLASS_EXAMPLES = 5  # fewer training examples than this make a class suspect (a typo, junk)


class LabelVocab:
    """Sorted distinct string labels; a label's id is its position in that order."""

    def __init__(self, labels: Sequence[str]) -> None:
        if not labels:
            raise UserError("a label vocabulary needs at least one label")
        if list(labels) != sorted(set(labels)):
            raise UserError(f"labels must be distinct and sorted, got {list(labels)}")
        self.labels: list[str] = list(labels)
        self._ids = {label: i for i, label in enumerate(self.labels)}

    @classmethod
    def build(cls, labels: Iterable[str]) -> LabelVocab:
        """Vocabulary of the distinct labels seen (build it from the training split)."""
        return cls(sorted(set(labels)))

    def __len__(self) -> int:
        return len(self.labels)

    def encode(self, labels: Iterable[str]) -> list[int]:
        """Ids of `labels`; an unknown label raises, naming the known ones."""
        ids = []
        for label in labels:
            if label not in self._ids:
                raise UserError(f"unknown label {label!r}; known labels: {self.labels}")
            ids.append(self._ids[label])
        return ids

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Labels of `ids`."""
        out = []
        for i in ids:
            if not 0 <= i < len(self.labels):
                raise UserError(f"label id {i} outside 0..{len(self.labels) - 1}")
            out.append(self.labels[i])
        return out

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the labels as UTF-8 JSON, atomically."""
        write_json(path, {"format": _FORMAT, "version": 1, "labels": self.labels})

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LabelVocab:
        """Read a vocabulary written by `save`."""
        data = read_json(path, "label vocabulary")
        fix = "rebuild it with LabelVocab.build from the training labels and save it again"
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise DataError(path, "not an attnlab label vocabulary file", fix)
        try:
            return cls(data["labels"])
        except (KeyError, TypeError, ValueError) as err:
            raise DataError(path, f"invalid label vocabulary ({err})", fix) from None


def check_label_counts(
    train_labels: Sequence[str], allow_rare_labels: bool = False
) -> dict[str, int]:
    """Refuse a training split a classifier cannot honestly learn from; return the rare classes.

    Fewer than two classes is always an error (a one-class set "learns" 100% accuracy). Classes
    with fewer than `MIN_CLASS_EXAMPLES` training examples (junk such as `?` or `N/A`, a stray
    `Positive` beside `positive`) are an error naming them, unless `allow_rare_labels` (the
    `--allow-rare-labels` flag); then they are returned, {label: count}, for a warning.
    """
    counts = Counter(train_labels)
    if len(counts) < 2:
        found = "no examples"
        for label, n in counts.items():
            found = f"only the class {label!r} ({n} examples)"
        raise UserError(
            f"the training split has {found}; a classifier needs at least two classes. "
            "Fix: check the label column and that the data file holds every class"
        )
    rare = {
        label: n
        for label, n in sorted(counts.items(), key=lambda kv: (kv[1], kv[0]))
        if n < MIN_CLASS_EXAMPLES
    }
    if rare and not allow_rare_labels:
        by_key: dict[str, list[str]] = {}
        for label in counts:
            by_key.setdefault(label.strip().casefold(), []).append(label)
        named = []
        for label, n in rare.items():
            twins = [other for other in by_key[label.strip().casefold()] if other != label]
            twin = f", like {twins[0]!r} but for case or spaces" if twins else ""
            named.append(f"{label!r} ({n}{twin})")
        noun = "class has" if len(rare) == 1 else "classes have"
        raise UserError(
            f"{len(rare)} {noun} fewer than {MIN_CLASS_EXAMPLES} training examples: "
            f"{', '.join(named)}. Fix: correct or remove those rows, or pass --allow-rare-labels "
            "to train on them anyway"
        )
    return rare
