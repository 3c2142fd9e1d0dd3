"""Run folders under misuse, second round: a resume that would train over weights it cannot
continue from, a copy into the run it copies and a saved setting this attnlab refuses are each
refused in one line with nothing changed; one seed gives one run in any process; the default
classify run (e5) teaches distill."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _cli import TINY, probe, snapshot, write_corpus
from test_run_misuse import BERT_TINY, write_text

from attnlab.cli import main

SRC = Path(__file__).resolve().parents[2] / "src"


def test_a_quantized_run_is_not_resumed_as_training(classify_run, tmp_path, capsys) -> None:
    int8 = tmp_path / "int8"
    assert main(["quantize", str(classify_run), "--out", str(int8)]) == 0
    before = snapshot(int8)
    argv = ["train", "classify", "--out", str(int8), "--resume", "--max-steps", "8"]
    probe(capsys, argv, "int8-quantised run", "train --resume")
    assert snapshot(int8) == before


def test_a_finished_run_without_a_checkpoint_is_not_trained_over(
    classify_run, tmp_path, capsys
) -> None:
    """A finished run whose state/ is gone (deleted to save space, or a copy made without it)
    keeps its weights: a resume has nothing to continue from and refuses."""
    run = tmp_path / "run"
    shutil.copytree(classify_run, run, ignore=shutil.ignore_patterns("state", ".lock"))
    before = snapshot(run)
    argv = ["train", "classify", "--out", str(run), "--resume", "--max-steps", "8"]
    probe(capsys, argv, "finished run", "no checkpoint", "model.safetensors", "another --out")
    assert snapshot(run) == before
    assert main(["eval", str(run)]) == 0  # the run is still the finished one


def _train_in_a_process(task: str, data: Path, out: Path, hash_seed: str) -> None:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(SRC)}
    argv = ["train", *OBJECTIVES[task], "--data", str(data), "--out", str(out), "--seed", "3",
            *BERT_TINY]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "attnlab", *argv], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, (hash_seed, done.stderr[-2000:])


# the pretraining objectives of `attnlab train mlm`, as command lines
OBJECTIVES = {"mlm": ["mlm"], "electra": ["mlm", "--objective", "electra"]}


@pytest.mark.parametrize("task", ["mlm", "electra"])
def test_one_seed_gives_one_run_in_processes_of_other_hash_seeds(task, tmp_path) -> None:
    """Each run in a fresh interpreter, with its own str-hash seed (set and dict order) and
    its own Rust hash-map keys (the tokenizer trainer's, safetensors' header)."""
    data = write_text(tmp_path / "text.txt")
    for seed in ("1", "2"):
        _train_in_a_process(task, data, tmp_path / seed, seed)
    names = ["tokenizer.json", "model.safetensors", "state/model.safetensors"]
    names += ["state/optimizer.safetensors"]
    for name in names:
        same = (tmp_path / "1" / name).read_bytes() == (tmp_path / "2" / name).read_bytes()
        assert same, f"{name} differs between PYTHONHASHSEED 1 and 2"


def test_distill_takes_the_default_e5_classify_run_as_teacher(tmp_path, monkeypatch) -> None:
    """`train classify` fine-tunes e5 by default: that run teaches, its soft labels are its own
    predictions (SentencePiece pieces, e5's "query: " prefix). A tiny random encoder of e5's
    layout stands in for the real one, as in test_e5_classify."""
    pytest.importorskip("semantra_multilingual")
    from _e5 import tiny_e5
    from test_e5_classify import TEXTS
    from test_e5_classify import train as train_e5

    import attnlab.models.e5 as e5
    from attnlab.finetune.distill import teacher_logits
    from attnlab.runs.load import load_run

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(e5, "load_e5", tiny_e5)
    data = write_corpus(tmp_path / "tiny.csv", n=32)
    assert train_e5(tmp_path / "teacher", data, "--max-steps", "2") == 0
    argv = ["train", "classify", "--teacher", str(tmp_path / "teacher"), "--data", str(data)]
    argv += ["--out", str(tmp_path / "student"), "--max-steps", "2", *TINY]
    assert main(argv) == 0
    teacher = load_run(tmp_path / "teacher")
    probs = teacher_logits(teacher, TEXTS, 2).softmax(-1)  # (3, C)
    for row, pred in zip(probs, teacher.predict(TEXTS)):
        want = [pred["probs"][label] for label in teacher.labels.labels]
        torch.testing.assert_close(row, torch.tensor(want), rtol=0, atol=1e-6)


@pytest.mark.parametrize("verb", ["quantize", "prune"])
def test_a_copy_into_the_run_itself_is_refused(classify_run, verb, capsys) -> None:
    """An --out inside the source run would copy its own staging folder into itself."""
    before = snapshot(classify_run)
    extra = ["--heads", "1"] if verb == "prune" else []
    out = classify_run / "copy"
    probe(capsys, [verb, str(classify_run), *extra, "--out", str(out)], "inside the run", verb)
    assert snapshot(classify_run) == before and not out.exists()


@pytest.mark.parametrize("task", ["mlm", "electra"])
def test_a_resume_names_a_saved_setting_this_attnlab_refuses(task, tmp_path, capsys) -> None:
    """A folder whose config.json holds a mask_prob of 0 (made before the range was checked,
    before any training) is not resumed, and the line names the file and what to do."""
    from attnlab.configs import to_dict
    from attnlab.runs.folder import write_config
    from attnlab.runs.registry import get_task
    from attnlab.runs.training import build_config

    run = tmp_path / "run"
    run.mkdir()
    mlm = get_task("mlm")
    raw = build_config(mlm, None, {"objective": task}).to_json()
    for name, section in mlm.derived_sections("bert").items():  # written by setup
        raw[name] = to_dict(section())
    raw["data"]["mask_prob"] = 0.0
    write_config(run, raw)
    before = snapshot(run)
    for extra in ([], ["--mask-prob", "0.15"]):
        argv = ["train", "mlm", "--out", str(run), "--resume", *extra]
        probe(capsys, argv, str(run / "config.json"), "mask_prob", "another --out")
    assert snapshot(run) == before
