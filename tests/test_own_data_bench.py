"""The own-data benchmark's datasets (benchmarks/classify/_own_data_sets.py) and its verdict.

Oracles: the Bible file's own book order (genres are contiguous runs of books in canonical
order), Python's csv module reading back what the builder wrote, and hand-computed verdicts.
"""

from __future__ import annotations

import csv
import gzip
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _repo_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


def _sets():
    from benchmarks.classify import _own_data_sets

    return _own_data_sets


def test_book_of_reads_numbered_books():
    sets = _sets()
    assert sets.book_of("1Sam 3:4") == "1Sam"
    assert sets.book_of("Song 8:14") == "Song"
    with pytest.raises(ValueError):
        sets.book_of("Gen")


def test_genres_are_the_file_books_in_canonical_runs():
    """Every book of bible.tsv.gz has a genre, each genre is one run of consecutive books in
    the file's order, and the runs come in GENRES's order: law ... apocalyptic."""
    sets = _sets()
    with gzip.open(sets.BIBLE, "rt", encoding="utf-8") as f:
        refs = [line.split("\t", 1)[0] for line in f][1:]
    books = list(dict.fromkeys(sets.book_of(r) for r in refs))
    assert len(books) == 66
    assert sorted(books) == sorted(sets.GENRE_OF)
    runs = [sets.GENRE_OF[b] for b in books]
    collapsed = [g for i, g in enumerate(runs) if i == 0 or runs[i - 1] != g]
    assert collapsed == list(sets.GENRES)
    assert sets.genre_of("Rev 22:21") == "apocalyptic"
    assert sets.genre_of("Acts 1:1") == "acts"
    assert sets.genre_of("John 3:16") == "gospels"
    assert sets.genre_of("1John 1:1") == "epistles"
    assert sets.genre_of("Mal 4:6") == "prophets"


def test_bible_rows_label_every_verse_in_both_languages():
    sets = _sets()
    en, zh = sets.bible_rows("en"), sets.bible_rows("zh")
    assert [g for _, g in en] == [g for _, g in zh]
    assert len({g for _, g in en}) == 8
    assert en[0] == ("In the beginning God created the heavens and the earth.", "law")
    assert zh[-1][1] == "apocalyptic"


def test_binary_rows_relabel_and_refuse_other_labels():
    sets = _sets()
    rows = sets.binary_rows(["好", "差", "好吧"], ["positive", "negative", "positive"])
    assert rows == [("好", "1"), ("差", "0"), ("好吧", "1")]
    with pytest.raises(KeyError):
        sets.binary_rows(["x"], ["neutral"])


def test_split_is_seeded_disjoint_and_nested():
    sets = _sets()
    seed = random.randrange(2**31)
    rows = [(f"text {i}", str(i % 3)) for i in range(500)]
    train, test = sets.split(rows, 200, 100, seed)
    assert (len(train), len(test)) == (200, 100), seed
    assert not set(train) & set(test), seed
    assert sets.split(rows, 200, 100, seed) == (train, test), seed
    big_train, same_test = sets.split(rows, 350, 100, seed)
    assert same_test == test and big_train[:200] == train, seed
    assert sets.split(rows, 200, 100, seed + 1)[1] != test, seed
    short_train, _ = sets.split(rows, 1000, 100, seed)
    assert len(short_train) == 400, seed


def test_written_csv_reads_back_with_the_csv_module(tmp_path):
    sets = _sets()
    rows = [("a, b", "1"), ('he said "no"', "0"), ("two\nlines", "1"), ("中文，逗号", "0")]
    sets.write_csv(tmp_path / "f.csv", rows)
    with (tmp_path / "f.csv").open(encoding="utf-8", newline="") as f:
        read = list(csv.reader(f))
    assert read[0] == ["text", "label"]
    assert [tuple(r) for r in read[1:]] == rows
    assert sets.read_csv(tmp_path / "f.csv") == ([t for t, _ in rows], [x for _, x in rows])


def test_train_size_of_caps_every_dataset():
    sets = _sets()
    assert sets.train_size_of("reviews_200", 2000) == 200
    assert sets.train_size_of("reviews_2000", 2000) == 2000
    assert sets.train_size_of("imdb", 500) == 500


def _row(arm, seed, acc, f1, wall):
    return {
        "dataset": "d", "arm": arm, "seed": seed, "accuracy": acc, "macro_f1": f1,
        "wall_s": wall, "peak_rss_gib": 1.0, "attnlab_flags": "" if arm == "attnlab" else None,
    }  # fmt: skip


def test_verdict_reads_the_spread_and_the_time_ratio():
    from benchmarks.classify.own_data import groups, verdict

    rows = [
        _row("attnlab", 0, 0.80, 0.80, 100), _row("attnlab", 1, 0.82, 0.82, 100),
        _row("trainer", 0, 0.83, 0.70, 500), _row("trainer", 1, 0.83, 0.94, 500),
    ]  # fmt: skip
    text = verdict(groups(rows)["d"])
    # accuracy: 0.81 vs 0.83, spread = sd(0.80, 0.82) = 0.0141 -> not met
    assert "accuracy 0.810 against 0.830 (not met, spread 0.014)" in text
    # macro-F1: 0.81 vs 0.82, spread = sd(0.70, 0.94) = 0.170 -> met only within the spread
    assert "macro-f1 0.810 against 0.820 (met, spread 0.170)" in text
    # wall 100 / 500 = 0.20 <= 0.25 -> met
    assert "wall time 0.20× the Trainer's (met)" in text
    one = verdict(
        groups([_row("attnlab", 0, 0.9, 0.9, 300), _row("trainer", 0, 0.8, 0.8, 1000)])["d"]
    )
    assert "one seed, no spread" in one and "0.30× the Trainer's (not met)" in one
    assert "CPU time" not in text  # no row recorded it
    timed = [r | {"cpu_s": r["wall_s"] / 2} for r in rows[:2]] + [
        r | {"cpu_s": r["wall_s"]} for r in rows[2:]
    ]
    assert "CPU time 0.10× (met)" in verdict(groups(timed)["d"])
    assert "not judged" in verdict(groups([_row("tfidf", 0, 0.5, 0.5, 1)])["d"])


def test_rows_with_attnlab_flags_stay_apart_from_the_default():
    from benchmarks.classify.own_data import _done, groups

    flagged = _row("attnlab", 0, 0.8, 0.8, 60) | {"attnlab_flags": "--turns 0"}
    assert set(groups([flagged, _row("attnlab", 0, 0.9, 0.9, 60)])["d"]) == {
        "attnlab",
        "attnlab --turns 0",
    }
    assert _done([flagged], "d", "attnlab", 0, "--turns 0")
    assert not _done([flagged], "d", "attnlab", 0, "")
    assert not _done([flagged | {"error": "boom"}], "d", "attnlab", 0, "--turns 0")


def test_overlap_is_read_from_start_and_end_times():
    from benchmarks.classify.own_data import _queues_note

    def row(finished, wall):
        return {"finished": f"2026-01-01T00:{finished}Z", "wall_s": wall}

    alone = [row("10:00", 60), row("12:00", 60)]  # 00:09-00:10, then 00:11-00:12
    assert _queues_note(alone) == "one arm ran at a time."
    side = [*alone, row("11:30", 120)]  # 00:09:30-00:11:30 overlaps both
    assert _queues_note(side).startswith("3 of the 3 runs overlapped")


def test_default_rows_from_before_the_recipe_change_are_the_previous_default(monkeypatch):
    """A plain attnlab row whose commit precedes RECIPE_CHANGE is shown apart, judged on its
    own line; the default's verdict reads only the rows after it."""
    from benchmarks.classify import own_data

    monkeypatch.setattr(own_data, "_before_change", lambda commit: commit == "old")
    old = _row("attnlab", 0, 0.70, 0.70, 100) | {"commit": "old"}
    new = _row("attnlab", 0, 0.90, 0.90, 100) | {"commit": "new"}
    trainer = _row("trainer", 0, 0.80, 0.80, 500)
    arms = own_data.groups([new, old, trainer])["d"]
    assert arms["attnlab"] == [new] and arms["attnlab-previous"] == [old]
    assert "accuracy 0.900 against 0.800 (met" in own_data.verdict(arms)
    assert "accuracy 0.700 against 0.800 (not met" in own_data.verdict(arms, "attnlab-previous")


def test_a_commit_git_does_not_know_is_not_called_earlier():
    from benchmarks.classify.own_data import _before_change

    assert not _before_change("")
    assert not _before_change("0000000 +src changes")
