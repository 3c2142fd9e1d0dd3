"""Ctrl-C during `attnlab train` says what continues the work: before the run folder is
published nothing was kept and the same command starts again (a --resume would find no run);
after, the run resumes with --resume. Other commands say only that they were interrupted."""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli import TINY, write_corpus

from attnlab.cli import main


def interrupt(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """Ctrl-C at the classify task's ``method`` (build_model: before the folder is published;
    step: at the first training step, after)."""
    from attnlab.tasks.classify import ClassifyTask

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    if method == "step":
        monkeypatch.setattr(ClassifyTask, "step", lambda self, cfg: ctrl_c)
    else:
        monkeypatch.setattr(ClassifyTask, method, ctrl_c)


def test_ctrl_c_says_run_again_before_the_folder_and_resume_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    corpus = write_corpus(tmp_path / "reviews.csv", n=40)
    run = tmp_path / "run"
    argv = ["train", "classify", "--out", str(run), "--data", str(corpus), *TINY,
            "--max-steps", "2", "--eval-every", "1", "--checkpoint-every", "1"]  # fmt: skip
    with monkeypatch.context() as patch:
        interrupt(patch, "build_model")
        assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    again = f"nothing was kept in {run}: run the same command again to start over"
    assert err == f"attnlab: interrupted ({again})", err
    assert not run.exists() and "--resume" not in err
    with monkeypatch.context() as patch:
        interrupt(patch, "step")
        assert main(argv) == 130  # the same command again: it starts, publishes, is stopped
    err = capsys.readouterr().err.strip().splitlines()[-1]
    resume = f"resume with `attnlab train classify --out {run} --resume`"
    assert err == f"attnlab: interrupted ({resume})", err
    assert main(["train", "classify", "--out", str(run), "--resume"]) == 0  # what it said works
