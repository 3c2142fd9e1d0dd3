"""A run does not depend on the folder it was trained from: data paths are saved
resolved with a checksum; a moved file is found again or refused with what to pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from _cli import probe, snapshot, train, write_corpus

from attnlab.cli import main


def test_a_relative_data_path_works_from_another_folder(tmp_path, capsys, monkeypatch) -> None:
    home, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    write_corpus(home / "data" / "small.csv")
    elsewhere.mkdir()
    run = tmp_path / "run"
    monkeypatch.chdir(home)
    assert train(run, Path("data/small.csv"), "--max-steps", "3", "--eval-every", "3") == 0
    config = json.loads((run / "config.json").read_text())
    assert config["data"]["data"] == str(home / "data" / "small.csv")
    record = json.loads((run / "data_files.json").read_text())
    assert record["data"]["given"] == "data/small.csv" and len(record["data"]["sha256"]) == 64
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["eval", str(run), "--json"]) == 0
    assert main(["train", "classify", "--out", str(run), "--resume", "--max-steps", "4"]) == 0

    # moved: eval and resume refuse with what to pass; the same file given again is accepted
    moved = tmp_path / "moved.csv"
    shutil.move(home / "data" / "small.csv", moved)
    before = snapshot(run)
    probe(capsys, ["eval", str(run)], "--data", "is gone", "small.csv")
    resume = ["train", "classify", "--out", str(run), "--resume", "--max-steps", "5"]
    probe(capsys, resume, "is gone", "pass --data NEW_PATH with --resume")
    other = write_corpus(tmp_path / "other.csv", n=100)
    probe(capsys, [*resume, "--data", str(other)], "not the data this run was trained on")
    assert snapshot(run) == before
    assert main([*resume, "--data", str(moved)]) == 0
    assert json.loads((run / "config.json").read_text())["data"]["data"] == str(moved)

    # moved back beside where it was typed: found again by its content, from any folder
    (home / "data" / "small.csv").write_bytes(moved.read_bytes())
    moved.unlink()
    monkeypatch.chdir(home)
    capsys.readouterr()
    assert main(["eval", str(run), "--json"]) == 0
    # changed in place: refused, naming what changed
    (home / "data" / "small.csv").write_text("text,label\n好,happy\n坏,angry\n", encoding="utf-8")
    before = snapshot(run)
    probe(capsys, [*resume[:-1], "6"], "has changed since the run was trained")
    assert snapshot(run) == before
