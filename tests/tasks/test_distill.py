"""Knowledge distillation: the loss is Hinton et al.'s formula, and `attnlab train classify
--teacher RUN` trains a student from a teacher run into an ordinary classifier run."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.finetune.distill import distillation_loss
from attnlab.runs import load_run, training

F64 = torch.float64


def test_the_loss_is_the_formula():
    B, C = 6, 4
    s, t = torch.randn(B, C, dtype=F64), torch.randn(B, C, dtype=F64) * 3
    y = torch.randint(0, C, (B,))
    T, a = 2.5, 0.3
    p_t, p_s = (t / T).softmax(-1), (s / T).softmax(-1)
    kl = (p_t * (p_t.log() - p_s.log())).sum(-1).mean()
    ce = -(s.log_softmax(-1)[torch.arange(B), y]).mean()
    want = a * T * T * kl + (1 - a) * ce
    torch.testing.assert_close(distillation_loss(s, t, y, T, a), want, rtol=0, atol=1e-12)
    torch.testing.assert_close(distillation_loss(s, t, y, T, 0.0), ce, rtol=0, atol=1e-12)
    # the soft term's gradient: T (p_s − p_t) / B per logit (Hinton et al., eq. 2, times T²)
    s.requires_grad_()
    (g,) = torch.autograd.grad(distillation_loss(s, t, y, T, 1.0), s)
    torch.testing.assert_close(g, T * (p_s - p_t) / B, rtol=0, atol=1e-12)
    assert distillation_loss(t, t, y, T, 1.0).abs() < 1e-12  # a perfect student: no soft loss
    assert math.isfinite(float(distillation_loss(s.detach(), t, y, 0.05, 0.5)))


TINY = {
    "arch": "char", "extra_train": "",
    "n_layers": "1", "d_ff": "64", "epochs": "6", "batch_size": "16", "lr": "3e-3",
    "tensorboard": "false", "precision": "fp32", "min_freq": "1", "checkpoint_every": "10",
    "dropout": "0.0", "attn_dropout": "0.0", "emb_dropout": "0.0", "ngram_buckets": "0",
}  # fmt: skip


def write_corpus(path: Path, n: int = 180) -> Path:
    rng = random.Random(0)
    filler = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动"
    markers = {"喜": "happy", "怒": "angry", "平": "calm"}
    lines = ["text,label"]
    for i in range(n):
        marker, label = list(markers.items())[i % 3]
        body = [rng.choice(filler) for _ in range(rng.randint(5, 20))]
        body.insert(rng.randrange(len(body) + 1), marker)
        lines.append(f"{''.join(body)},{label}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_student_learns_from_a_teacher_run(tmp_path, capsys):
    data = str(write_corpus(tmp_path / "d.csv"))
    teacher = tmp_path / "teacher"
    training.train("classify", teacher, {"data": data, "d_model": "32", "n_heads": "2", **TINY})
    student = tmp_path / "student"
    settings = {"data": data, "d_model": "16", "n_heads": "2", **TINY, "epochs": "10"}
    results = training.train(
        "classify",
        student,
        {**settings, "teacher": str(teacher), "temperature": "3", "alpha": "0.7"},
    )
    assert results["test"]["accuracy"] >= 0.6, results["test"]  # chance is 1/3
    config = json.loads((student / "config.json").read_text())
    assert config["task"] == "classify" and config["distill"]["alpha"] == 0.7
    run = load_run(student)
    assert run.config.model.d_model == 16
    assert main(["predict", str(student), "喜喜"]) == 0
    assert main(["eval", str(student)]) == 0
    capsys.readouterr()
    bad = {**settings, "alpha": "1.5", "teacher": str(teacher)}
    with pytest.raises(ValueError, match="alpha"):
        training.train("classify", tmp_path / "bad", bad)
    gone = ["--teacher", str(tmp_path / "nowhere"), "--out", str(tmp_path / "none")]
    assert main(["train", "classify", "--arch", "char", "--data", data, *gone]) == 2
    assert not (tmp_path / "none").exists()


def test_the_teacher_scores_the_lexicon_words_the_student_trains_on(tmp_path):
    """HowNet's words join the student's training split: the teacher reads them too."""
    rng = random.Random(0)
    filler = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动"
    lines = ["text,label"]
    for i in range(120):
        marker, label = ("好", "positive") if i % 2 else ("差", "negative")
        lines.append(marker + "".join(rng.choice(filler) for _ in range(8)) + f",{label}")
    data = tmp_path / "d.csv"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    settings = {"data": str(data), "d_model": "16", "n_heads": "2", **TINY, "epochs": "1"}
    teacher = tmp_path / "teacher"
    training.train("classify", teacher, settings)
    student = tmp_path / "student"
    training.train("classify", student,
                   {**settings, "teacher": str(teacher), "extra_train": "hownet"})  # fmt: skip
    report = json.loads((student / "data_report.json").read_text())
    assert report["extra_training"]["added"] > 1000  # the words rode along with their logits
