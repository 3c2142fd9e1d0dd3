"""Tests for `LabelVocab`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnlab.data.errors import DataError
from attnlab.data.labels import LabelVocab


def test_sorted_ids_round_trip(tmp_path: Path) -> None:
    vocab = LabelVocab.build(["positive", "negative", "positive", "中性"])
    assert vocab.labels == ["negative", "positive", "中性"] and len(vocab) == 3
    assert vocab.encode(["positive", "negative"]) == [1, 0]
    assert vocab.decode([2, 0]) == ["中性", "negative"]
    path = tmp_path / "labels.json"
    vocab.save(path)
    assert "中性" in path.read_text(encoding="utf-8")
    assert LabelVocab.load(path).labels == vocab.labels


def test_unknown_label_and_id() -> None:
    vocab = LabelVocab.build(["a", "b"])
    with pytest.raises(ValueError, match=r"unknown label 'c'; known labels: \['a', 'b'\]"):
        vocab.encode(["a", "c"])
    with pytest.raises(ValueError, match="outside"):
        vocab.decode([2])


def test_load_rejects_unsorted_or_foreign_files(tmp_path: Path) -> None:
    path = tmp_path / "labels.json"
    path.write_text(json.dumps({"format": "attnlab.label_vocab", "labels": ["b", "a"]}), "utf-8")
    with pytest.raises(DataError, match="sorted"):
        LabelVocab.load(path)
    path.write_text(json.dumps({"labels": ["a"]}), "utf-8")
    with pytest.raises(DataError, match="not an attnlab label vocabulary"):
        LabelVocab.load(path)
