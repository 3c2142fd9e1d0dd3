"""`LabelVocab`: string class labels to contiguous integer ids and back."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from attnlab.data.errors import DataError
from attnlab.data.io import read_json, write_json

_FORMAT = "attnlab.label_vocab"


class LabelVocab:
    """Sorted distinct string labels; a label's id is its position in that order."""

    def __init__(self, labels: Sequence[str]) -> None:
        if not labels:
            raise ValueError("a label vocabulary needs at least one label")
        if list(labels) != sorted(set(labels)):
            raise ValueError(f"labels must be distinct and sorted, got {list(labels)}")
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
                raise ValueError(f"unknown label {label!r}; known labels: {self.labels}")
            ids.append(self._ids[label])
        return ids

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Labels of `ids`."""
        out = []
        for i in ids:
            if not 0 <= i < len(self.labels):
                raise ValueError(f"label id {i} outside 0..{len(self.labels) - 1}")
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
