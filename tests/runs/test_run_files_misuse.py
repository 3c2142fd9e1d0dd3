"""Loading run folders whose files hold valid JSON of the wrong shape: one line
naming the file, exit 2, no traceback, nothing changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _cli import probe, snapshot, train, write_corpus


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    corpus = write_corpus(tmp_path_factory.mktemp("data") / "reviews.csv")
    run = tmp_path_factory.mktemp("runs") / "done"
    assert train(run, corpus, "--max-steps", "2", "--eval-every", "2") == 0
    return run


@pytest.mark.parametrize(
    "name, edit, needles",
    [
        ("data_report.json", lambda d: [1, 2, 3], ["data_report.json", "expected a JSON object"]),
        ("data_report.json", lambda d: {"max_len": None} | {}, ["data_report.json"]),
        ("labels.json", lambda d: {**d, "labels": ["a", "b", "c"]}, ["3 labels", "2 classes"]),
        ("config.json", lambda d: {**d, "model": None}, ["config.json", "model"]),
        ("config.json", lambda d: {**d, "train": [1]}, ["config.json", "train"]),
        ("config.json", lambda d: [d], ["config.json", "task"]),
        ("data_files.json", lambda d: {"data": 3}, ["data_files.json"]),
    ],
)
def test_valid_json_of_the_wrong_shape_is_one_line(tmp_path, finished, capsys, name, edit, needles):
    run = tmp_path / "copy"
    shutil.copytree(finished, run)
    path = run / name
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    before = snapshot(run)
    probe(capsys, ["predict", str(run), "好"] if name != "data_files.json" else ["eval", str(run)],
          *needles)  # fmt: skip
    probe(capsys, ["train", "classify", "--out", str(run), "--resume", "--max-steps", "3"])
    assert snapshot(run) == before


def test_zero_width_text_is_empty_and_cr_only_stdin_is_split(finished, capsys, monkeypatch):
    import io

    from attnlab.cli import main

    probe(capsys, ["predict", str(finished), "\u200b\u200d"], "text 1 is empty")
    monkeypatch.setattr("sys.stdin", io.StringIO("好\r坏\r不错"))
    capsys.readouterr()
    assert main(["predict", str(finished), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in rows] == ["好", "坏", "不错"]


def test_one_column_for_text_and_label_and_a_short_learned_context(tmp_path, capsys):
    from _cli import TINY

    corpus = write_corpus(tmp_path / "d.csv")
    out = tmp_path / "runs" / "r"
    argv = ["train", "classify", "--out", str(out), "--data", str(corpus), *TINY]
    probe(capsys, [*argv, "--text-col", "label"], "same column", "--text-col")
    probe(capsys, [*argv, "--pos", "learned", "--context", "8"], "--context 8", "--truncate-len")
    assert list(tmp_path.iterdir()) == [corpus]
