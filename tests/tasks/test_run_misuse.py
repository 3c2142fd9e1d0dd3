"""Command-line misuse of ablate, train, prune, quantize and bench: each refused in one line
(exit 2, no traceback) before anything is written, or made to work as documented."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _cli import TINY, probe, snapshot, train, write_corpus

from attnlab.cli import main


def _as_set(flags: list[str]) -> list[str]:
    """["--d-model", "16", ...] -> ["d_model=16", ...] (the form of ablate --set)."""
    return [f"{k[2:].replace('-', '_')}={v}" for k, v in zip(flags[::2], flags[1::2])]


def test_ablate_runs_the_readme_command_end_to_end(tmp_path: Path, capsys) -> None:
    data = write_corpus(tmp_path / "tiny.csv")
    out = tmp_path / "sweep"
    argv = ["ablate", "classify", "n_heads=1,2", "--steps", "2", "--out", str(out)]
    code = main([*argv, "--set", f"data={data}", *_as_set(TINY)])
    assert code == 0, capsys.readouterr().err
    assert json.loads((out / "sweep.json").read_text())["variants"] == ["preset", "n_heads=1"]
    rows = (out / "results.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[1].startswith("preset,") and rows[2].startswith("n_heads=1,")
    assert (out / "results.md").exists() and (out / "results.png").exists()


def test_ablate_refuses_an_unknown_factor_before_making_the_sweep_folder(
    tmp_path: Path, capsys
) -> None:
    out = tmp_path / "sweep"
    probe(capsys, ["ablate", "classify", "n_hedas=1,2", "--out", str(out)], "n_hedas")
    assert not out.exists()


@pytest.fixture(scope="module")
def classify_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("run")
    assert train(root / "run", write_corpus(root / "tiny.csv"), "--max-steps", "4") == 0
    return root / "run"


def test_a_pruned_run_is_not_resumed_as_training(classify_run, tmp_path, capsys) -> None:
    pruned = tmp_path / "pruned"
    assert main(["prune", str(classify_run), "--heads", "1", "--out", str(pruned)]) == 0
    before = snapshot(pruned)
    argv = ["train", "classify", "--out", str(pruned), "--resume"]
    probe(capsys, argv, "pruned copy", "cannot be resumed")
    assert snapshot(pruned) == before


def test_a_quantized_run_is_not_pruned(classify_run, tmp_path, capsys) -> None:
    int8 = tmp_path / "int8"
    assert main(["quantize", str(classify_run), "--out", str(int8)]) == 0
    before = snapshot(tmp_path)
    out = tmp_path / "pruned"
    probe(capsys, ["prune", str(int8), "--heads", "1", "--out", str(out)], "int8", "prune")
    assert snapshot(tmp_path) == before and not out.exists()


@pytest.mark.parametrize("verb", ["quantize", "prune"])
def test_a_users_partial_file_beside_out_is_left_alone(classify_run, tmp_path, verb) -> None:
    """The copy is staged under a name of its own: a folder named like the old staging folder
    (OUT.partial) is the user's, kept as it was."""
    mine = tmp_path / "q" / "x.partial"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("my notes\n")
    extra = ["--heads", "1"] if verb == "prune" else []
    assert main([verb, str(classify_run), *extra, "--out", str(tmp_path / "q" / "x")]) == 0
    assert snapshot(mine) == {"notes.txt": snapshot(tmp_path / "q")["x.partial/notes.txt"]}
    assert (mine / "notes.txt").read_text() == "my notes\n"
    assert sorted(p.name for p in mine.parent.iterdir()) == ["x", "x.partial"]
