"""`attnlab ablate classify`: a budget or setting given twice, no seeds, and an --out that is a
file, someone else's folder or a sweep of other settings are refused in one line before
anything is trained or written; the same command again continues its own sweep."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tasks"))
from _cli import TINY, probe, snapshot, write_corpus  # noqa: E402

from attnlab.cli import main  # noqa: E402


def tiny_set(data: Path) -> list[str]:
    """--set values of a tiny character model (its --arch is ablate's own option)."""
    pairs = [(k, v) for k, v in zip(TINY[::2], TINY[1::2]) if k != "--arch"]
    return ["--set", f"data={data}", *(f"{k[2:].replace('-', '_')}={v}" for k, v in pairs)]


def ablate(out: Path, data: Path, *extra: str) -> list[str]:
    return ["ablate", "classify", "n_heads=1,2", "--arch", "char", "--out", str(out), *extra,
            *tiny_set(data)]  # fmt: skip


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[Path, Path]:
    """A finished two-step sweep (its data file beside it)."""
    root = tmp_path_factory.mktemp("ablate")
    data = write_corpus(root / "tiny.csv")
    assert main(ablate(root / "sweep", data, "--steps", "2")) == 0
    return root / "sweep", data


@pytest.mark.parametrize(
    "flags, fields, needles",
    [
        (["--steps", "2", "--epochs", "3"], [], ["--epochs 3 would be ignored", "--steps 2"]),
        (["--steps", "2"], ["max_steps=4"], ["max_steps is given twice", "--steps 2", "=4"]),
        (["--minutes", "1"], ["max_minutes=2"], ["max_minutes is given twice", "--minutes 1"]),
        (["--seeds", "0", "--steps", "2"], [], ["--seeds must be >= 1", "got 0"]),
    ],
)
def test_a_budget_said_twice_or_no_seeds_is_refused_before_the_folder(
    flags, fields, needles, tmp_path, capsys
) -> None:
    data = write_corpus(tmp_path / "tiny.csv")
    out = tmp_path / "sweep"
    probe(capsys, [*ablate(out, data, *flags), *fields], *needles)  # fields join --set
    assert not out.exists()


def test_an_out_that_is_a_file_or_a_foreign_folder_is_left_alone(tmp_path, capsys) -> None:
    data = write_corpus(tmp_path / "tiny.csv")
    probe(capsys, ablate(data, data, "--steps", "2"), "is a file")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "results.md").write_text("my notes\n")
    before = snapshot(tmp_path)
    probe(capsys, ablate(mine, data, "--steps", "2"), "holds files but no sweep", "new folder")
    assert snapshot(tmp_path) == before


def test_a_sweep_of_other_settings_is_refused_and_the_same_one_continues(sweep, capsys):
    out, data = sweep
    before = snapshot(out)
    line = probe(capsys, ablate(out, data, "--steps", "3"), "holds a sweep with fixed")
    assert "fixed max_steps=2, this command has max_steps=3:" in line, line
    probe(capsys, ablate(out, data, "--steps", "2", "--grid"), "grid False", "True")
    assert snapshot(out) == before
    capsys.readouterr()
    assert main(ablate(out, data, "--steps", "2")) == 0  # the same command: nothing to train
    assert capsys.readouterr().err.count("done already") == 2
    assert {k: v for k, v in snapshot(out).items() if "-seed" in k} == {
        k: v for k, v in before.items() if "-seed" in k
    }
