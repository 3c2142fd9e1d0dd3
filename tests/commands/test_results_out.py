"""Every command that prints its results checks that they arrived, through one path (cli's
results_out): a full disk (``> /dev/full``) is one line and exit 2, a closed standard output
(``>&-``) is refused before the command starts; never a traceback, never a silent exit 0."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.cli import main

sys.path.insert(0, str(Path(__file__).parents[1] / "explore"))
import explore_runs  # noqa: E402
from _one_line import one_line  # noqa: E402  (this folder is on the path under pytest)

SRC = Path(__file__).resolve().parents[2] / "src"
FULL = Path("/dev/full")


@pytest.fixture(scope="module")
def commands(tmp_path_factory) -> dict[str, list[str]]:
    """Each command with arguments it answers quickly (a tiny run, the bundled MiniLM)."""
    root = tmp_path_factory.mktemp("results")
    run = explore_runs.classifier_run(root)
    data = root / "labelled.csv"
    data.write_text("text,label\n好看极了,positive\n剧情拖沓,negative\n", encoding="utf-8")
    return {
        "the report": ["eval", str(run), "--data", str(data)],
        "the vectors": ["embed", "a cat", "--arch", "minilm"],
        "the similarity": ["similarity", "a cat", "a dog", "--arch", "minilm"],
        "the models table": ["models"],
        "the predictions": ["predict", str(run), "好"],
    }




@pytest.mark.skipif(not FULL.exists(), reason="no /dev/full here")
def test_a_full_disk_is_one_line_and_exit_2(commands, monkeypatch, capsys) -> None:
    for what, argv in commands.items():
        full = open(FULL, "w")  # noqa: SIM115
        monkeypatch.setattr(sys, "stdout", full)
        code = main(argv)
        with contextlib.suppress(OSError):  # what the command left in the buffer has no room
            full.close()
        assert code == 2, argv
        one_line(capsys.readouterr().err, f"cannot write {what}", "No space left on device")


def test_a_closed_standard_output_is_refused_before_the_command(commands, monkeypatch, capsys):
    for what, argv in commands.items():
        monkeypatch.setattr(sys, "stdout", None)  # what Python makes of `>&-`
        assert main(argv) == 2, argv
        one_line(capsys.readouterr().err, "standard output is closed", f"send {what}")


def test_other_write_errors_of_a_command_are_not_blamed_on_standard_output(capsys) -> None:
    """A command's own file that cannot be written keeps its own message."""
    assert main(["embed", "a", "--arch", "minilm", "--out", "/proc/v.npy"]) == 2
    err = capsys.readouterr().err
    assert "standard output" not in err and "/proc/v.npy" in err, err


def test_the_executable_with_its_output_closed(commands) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    quoted = " ".join(f"'{c}'" for c in [sys.executable, "-m", "attnlab", "models"])
    done = subprocess.run(["bash", "-c", f"exec {quoted} >&-"], env=env,
                          stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert done.returncode == 2
    one_line(done.stderr, "standard output is closed", "the models table")
