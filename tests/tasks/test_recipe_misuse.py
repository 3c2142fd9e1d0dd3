"""The main job's recipe under misuse: a resume before the first checkpoint, repeated and
relative data settings, a cleaning threshold that empties a class, an unknown extra corpus,
and two identical runs. Each is a fresh start that equals the uninterrupted run, a setting that
is accepted as given, or one line and exit 2 with nothing written. A tiny random encoder of
e5's layout stands in for the real one (test_e5_classify)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from _e5 import tiny_e5
from test_e5_classify import NEGATIVE, POSITIVE, train

from attnlab.cli import main
from attnlab.tensor_files import read_tensors

pytest.importorskip("semantra_multilingual")


@pytest.fixture
def reviews(tmp_path) -> Path:
    """Twelve texts of each class (the cleaning test needs a split of more than five each)."""
    rows = [("text", "label")] + [(f"{t}{i}", "positive") for t in POSITIVE for i in range(3)]
    rows += [(f"{t}{i}", "negative") for t in NEGATIVE for i in range(3)]
    path = tmp_path / "reviews.tsv"
    path.write_text("\n".join("\t".join(r) for r in rows) + "\n", encoding="utf-8")
    return path


def weights(run: Path) -> dict:
    return read_tensors(run / "model.safetensors", "weights")


def same(a: Path, b: Path) -> bool:
    x, y = weights(a), weights(b)
    return x.keys() == y.keys() and all((x[k] == y[k]).all() for k in x)


def test_a_resume_before_the_first_checkpoint_is_a_fresh_start(tiny, reviews, tmp_path):
    """Killed before its first checkpoint, the run has no weights of its own to continue: the
    resume runs every step of the recipe, the probe's fit of the head included, and ends where
    the uninterrupted run ends."""
    from attnlab.tasks.classify import ClassifyTask

    class Killed(BaseException):
        """What kill -9 leaves: no handler runs, no checkpoint is written."""

    real = ClassifyTask.step

    def dies_at_step_2(self, cfg):
        inner, calls = real(self, cfg), {"n": 0}

        def step(model, batch):
            calls["n"] += 1
            if calls["n"] == 2:
                raise Killed
            return inner(model, batch)

        return step

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    recipe = ["--max-steps", "3", "--probe-first", "true", "--checkpoint-every", "50"]
    assert train(straight, reviews, *recipe) == 0
    with pytest.MonkeyPatch.context() as patch, pytest.raises(Killed):
        patch.setattr(ClassifyTask, "step", dies_at_step_2)
        train(killed, reviews, *recipe)
    assert (killed / "config.json").exists() and not (killed / "state").exists()
    assert main(["train", "classify", "--out", str(killed), "--resume"]) == 0
    assert same(straight, killed)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_one_command_and_seed_give_one_set_of_weights(reviews, tmp_path, monkeypatch, pooling):
    """e5 has no pooler: the [CLS] pooler a classifier adds is drawn from the run's seed, so
    two runs of one command are equal in every tensor, with either pooling. The stand-in's
    pooler is drawn afresh at each load, outside any seed, as the real loader's is."""
    import attnlab.models.e5 as e5

    def unseeded_pooler(*args, **kwargs):
        model, tokenizer = tiny_e5(*args, **kwargs)
        g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
        torch.nn.init.normal_(model.pooler.weight, std=0.02, generator=g)
        return model, tokenizer

    monkeypatch.setattr(e5, "load_e5", unseeded_pooler)
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        assert train(out, reviews, "--max-steps", "2", "--pooling", pooling) == 0
    assert same(a, b)


@pytest.mark.parametrize("extra", [["--extra-train", ""], ["--extra-train="]])
def test_the_first_command_again_with_resume_is_accepted(tiny, reviews, tmp_path, extra):
    out = tmp_path / "run"
    assert train(out, reviews, "--max-steps", "2", *extra) == 0
    assert train(out, reviews, "--max-steps", "2", *extra, "--resume") == 0


def test_a_named_extra_corpus_given_again_on_resume_is_no_change(tiny, reviews, tmp_path):
    out = tmp_path / "run"
    named = ["--extra-train", "pang_lee", "--extra-train-examples", "8"]
    assert train(out, reviews, "--max-steps", "2", "--keep-state", "true", *named) == 0
    assert train(out, reviews, "--max-steps", "3", *named, "--resume") == 0


def test_relative_extra_files_are_recorded_absolute(tiny, reviews, tmp_path, monkeypatch):
    """A relative --extra-train list is saved resolved: a resume from another folder finds
    each file."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    for name, rows in (("a.csv", "Great film,positive\n"), ("b.csv", "Dull,negative\n")):
        (work / name).write_text("text,label\n" + rows, encoding="utf-8")
    monkeypatch.chdir(work)
    assert train(Path("run"), reviews, "--max-steps", "2", "--checkpoint-every", "1",
                 "--keep-state", "true", "--extra-train", "a.csv,b.csv") == 0  # fmt: skip
    monkeypatch.chdir(elsewhere)
    run = work / "run"
    assert main(["train", "classify", "--out", str(run), "--resume", "--max-steps", "3"]) == 0


def test_cleaning_that_leaves_a_class_too_few_texts_is_refused(tiny, reviews, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--max-steps", "1", "--train-layers", "1", "--clean-labels", "0.99"]
    assert train(out, reviews, *argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and "label cleaning at p 0.99 dropped" in err[0], err
    assert "--clean-labels" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("name", ["pang_le", "FOLDER"])
def test_an_unknown_extra_corpus_lists_the_known_ones(tiny, reviews, tmp_path, capsys, name):
    name = str(tmp_path) if name == "FOLDER" else name
    out = tmp_path / "run"
    assert train(out, reviews, "--max-steps", "1", "--extra-train", name) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pass fmt" not in err[0], err
    assert ("one of pang_lee, imdb" in err[0]) or ("is a folder" in err[0]), err
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--monitor", "val_accuracy"], "use one of val_acc, val_macro_f1, val_loss, ood_dev_acc"),
        (["--monitor", "val_loss"], "give --monitor-mode min"),
        (["--monitor", "ood_dev_loss"], "give --monitor-mode min"),
        (["--monitor", "ood_dev_acc", "--monitor-mode", "min"], "give --monitor-mode max"),
    ],
)
def test_a_monitor_the_task_does_not_report_or_read_backwards_is_refused(
    tiny, reviews, tmp_path, capsys, argv, says
):
    """The metric that chooses the checkpoint is checked before anything runs: a name the
    evaluation never reports would fail at the first evaluation, a loss maximised would keep
    the worst weights."""
    out = tmp_path / "run"
    assert train(out, reviews, "--max-steps", "1", *argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not out.exists()


def test_ood_dev_needs_positive_and_negative_labels(tiny, tmp_path, capsys):
    three = (("好", "a"), ("坏", "b"), ("中", "c"))
    rows = [("text", "label")] + [(f"{t}{i}", lab) for i in range(12) for t, lab in three]
    data = tmp_path / "three.tsv"
    data.write_text("\n".join("\t".join(r) for r in rows) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    assert train(out, data, "--max-steps", "1", "--monitor", "ood_dev_acc") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "positive/negative only" in err[0], err
    assert not out.exists()
