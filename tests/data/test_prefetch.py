"""The command line's early read of a run's tokenizer.json: the same tokenizer, once, only for
the file that was read; a failed or stale read falls back to the loader's own."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, models

from attnlab import prefetch
from attnlab.data.errors import DataError
from attnlab.data.sentencepiece import load_tokenizer

UNIGRAM = {"<pad>": 0, "<unk>": 0, "<s>": 0, "</s>": 0, "<mask>": 0, "▁好": -1.0, "看": -2.0}


def write_unigram(path: Path, pieces: dict[str, float]) -> Path:
    tok = Tokenizer(models.Unigram([(p, s) for p, s in pieces.items()], unk_id=1))
    tok.save(str(path))
    return path


def test_the_early_read_is_the_tokenizer_the_loader_returns_once(tmp_path):
    path = write_unigram(tmp_path / "tokenizer.json", UNIGRAM)
    prefetch.start(path)
    early = prefetch.take(path)
    assert (
        isinstance(early, Tokenizer)
        and early.get_vocab() == Tokenizer.from_file(str(path)).get_vocab()
    )
    assert prefetch.take(path) is None  # once: a second load reads the file itself
    assert prefetch.take(tmp_path / "never.json") is None


def test_a_file_changed_after_the_early_read_is_read_again(tmp_path):
    path = write_unigram(tmp_path / "tokenizer.json", UNIGRAM)
    prefetch.start(path)
    prefetch._pending[str(path.resolve())][0].join()
    write_unigram(path, {**UNIGRAM, "片": -3.0})
    assert prefetch.take(path) is None
    prefetch.start(path)
    assert load_tokenizer(path).vocab_size == len(UNIGRAM) + 1


def test_a_damaged_file_is_still_reported_by_the_loader(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text('{"model": ', encoding="utf-8")
    prefetch.start(path)
    with pytest.raises(DataError, match="not a readable tokenizer.json"):
        load_tokenizer(path)


def test_the_loader_uses_the_early_read(tmp_path, monkeypatch):
    import attnlab.data.sentencepiece as sentencepiece

    path = write_unigram(tmp_path / "tokenizer.json", UNIGRAM)
    prefetch.start(path)

    class NoReading:
        @staticmethod
        def from_file(_: str) -> None:
            raise AssertionError("read the file again")

    monkeypatch.setattr(sentencepiece, "Tokenizer", NoReading)
    assert load_tokenizer(path).vocab_size == len(UNIGRAM)


def test_only_the_verbs_that_load_a_run_read_early(tmp_path, monkeypatch):
    started: list[Path] = []
    monkeypatch.setattr(prefetch, "start", started.append)
    run = str(tmp_path)
    for argv in (["predict", run, "x"], ["eval", run], ["attention", run, "x"]):
        prefetch.start_for(argv)
    for argv in (["train", "classify", "--out", run], ["predict", "--json", run], ["eval"]):
        prefetch.start_for(argv)
    assert started == [Path(run) / "tokenizer.json"] * 3
