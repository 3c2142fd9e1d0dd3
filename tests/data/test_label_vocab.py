"""Tests for `LabelVocab`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnlab.data.errors import DataError
from attnlab.data.labels import MIN_CLASS_EXAMPLES, LabelVocab, check_label_counts


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


def labels_with(**extra: int) -> list[str]:
    """Two healthy classes plus `extra` = {label: count}."""
    base = ["positive"] * 20 + ["negative"] * 20
    return base + [label for label, n in extra.items() for _ in range(n)]


def test_healthy_labels_pass_and_report_nothing_rare() -> None:
    assert check_label_counts(labels_with()) == {}
    assert check_label_counts(["a"] * MIN_CLASS_EXAMPLES + ["b"] * MIN_CLASS_EXAMPLES) == {}


def test_one_class_is_refused_naming_it_and_its_count() -> None:
    with pytest.raises(ValueError, match=r"only the class 'positive' \(30 examples\)") as err:
        check_label_counts(["positive"] * 30)
    assert "at least two classes" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="only the class"):  # the flag never allows this
        check_label_counts(["positive"] * 30, allow_rare_labels=True)
    with pytest.raises(ValueError, match="no examples"):
        check_label_counts([])


@pytest.mark.parametrize("junk", ["?", "N/A", "Positive", "positive "])
def test_a_junk_label_is_a_rare_class_refused_by_name(junk: str) -> None:
    with pytest.raises(ValueError, match="--allow-rare-labels") as err:
        check_label_counts(labels_with(**{junk: 1}))
    message = str(err.value)
    assert f"{junk!r} (1" in message and f"fewer than {MIN_CLASS_EXAMPLES}" in message
    assert "\n" not in message and "'negative'" not in message
    if junk.strip().casefold() == "positive":
        assert "like 'positive' but for case or spaces" in message


def test_every_rare_class_is_named_rarest_first_and_the_flag_allows_them() -> None:
    labels = labels_with(**{"?": 2, "N/A": 1, "neutral": MIN_CLASS_EXAMPLES - 1})
    with pytest.raises(ValueError, match=r"3 classes have .*'N/A' \(1\), '\?' \(2\), 'neutral'"):
        check_label_counts(labels)
    rare = check_label_counts(labels, allow_rare_labels=True)
    assert rare == {"N/A": 1, "?": 2, "neutral": MIN_CLASS_EXAMPLES - 1}
    assert check_label_counts(labels_with(neutral=MIN_CLASS_EXAMPLES)) == {}  # the bound itself
