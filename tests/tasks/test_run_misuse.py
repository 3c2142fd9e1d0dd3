"""Command-line misuse of ablate, train, prune, quantize and bench: each refused in one line
(exit 2, no traceback) before anything is written, or made to work as documented."""

from __future__ import annotations

import json
from pathlib import Path

from _cli import TINY, probe, write_corpus

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
