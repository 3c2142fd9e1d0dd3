"""Command-line misuse of ablate, train, prune, quantize and bench: each refused in one line
(exit 2, no traceback) before anything is written, or made to work as documented."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from _cli import TINY, probe, snapshot, train, write_corpus

from attnlab.cli import main
from attnlab.runs.load import load_run
from attnlab.train.checkpoint import save_weights


def _as_set(flags: list[str]) -> list[str]:
    """["--d-model", "16", ...] -> ["d_model=16", ...] (the form of ablate --set); the --arch
    that picks the character model is ablate's own option."""
    pairs = [(k, v) for k, v in zip(flags[::2], flags[1::2]) if k != "--arch"]
    return [f"{k[2:].replace('-', '_')}={v}" for k, v in pairs]


def test_ablate_runs_the_readme_command_end_to_end(tmp_path: Path, capsys) -> None:
    data = write_corpus(tmp_path / "tiny.csv")
    out = tmp_path / "sweep"
    argv = ["ablate", "classify", "n_heads=1,2", "--steps", "2", "--out", str(out)]
    argv += ["--arch", "char"]
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


def _distill(student: str, teacher: str, data: Path, *extra: str) -> list[str]:
    assert TINY[:2] == ["--arch", "char"]  # a character-model student
    return ["train", "classify", "--out", student, "--teacher", teacher, "--data", str(data),
            *TINY, *extra]  # fmt: skip


def test_a_distill_resume_finds_a_relative_teacher_and_refuses_a_retrained_one(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    data = write_corpus(tmp_path / "tiny.csv")
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert train(work / "teacher", data, "--max-steps", "2") == 0
    monkeypatch.chdir(work)
    argv = _distill("student", "teacher", data, "--max-steps", "2", "--checkpoint-every", "1")
    assert main(argv) == 0, capsys.readouterr().err
    monkeypatch.chdir(elsewhere)  # the relative --teacher, resumed from another folder
    student = str(work / "student")
    resume = ["train", "classify", "--out", student, "--resume", "--max-steps", "3"]
    assert main(resume) == 0, capsys.readouterr().err
    assert json.loads((work / "student" / "results.json").read_text())["summary"]["steps"] == 3
    before = snapshot(work / "student")
    teacher = load_run(work / "teacher")
    with torch.no_grad():
        next(teacher.model.parameters()).add_(0.5)  # other weights, every file size the same
    sizes = {p.name: p.stat().st_size for p in (work / "teacher").iterdir()}
    save_weights(teacher.model, work / "teacher" / "model.safetensors")
    assert {p.name: p.stat().st_size for p in (work / "teacher").iterdir()} == sizes
    resume[-1] = "4"
    probe(capsys, resume, "--teacher", "has changed since the run was trained")
    shutil.rmtree(work / "teacher")  # the teacher retrained in place, with another seed
    assert train(work / "teacher", data, "--max-steps", "2", "--seed", "1") == 0
    probe(capsys, resume, "--teacher", "has changed since the run was trained")
    assert snapshot(work / "student") == before
    assert main(["eval", student]) == 0  # evaluating the student needs no teacher


def test_distill_takes_a_fine_tuned_bert_teacher(tmp_path: Path, capsys, monkeypatch) -> None:
    """A fine-tuned BERT teacher (classify --arch CHECKPOINT): its soft labels are its own
    predictions, read with its WordPiece tokenizer."""
    from attnlab.finetune.distill import teacher_logits
    from attnlab.verify.checks_bert_dir import write_tiny_chinese_bert

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = write_corpus(tmp_path / "tiny.csv")
    bert = tmp_path / "bert"
    checkpoint = str(write_tiny_chinese_bert(tmp_path / "hf"))
    fine_tune = ["train", "classify", "--arch", checkpoint, "--out", str(bert), "--data", str(data)]
    extra = ["--extra-train", ""]
    assert main([*fine_tune, "--max-steps", "2", *extra, *TINY[-6:]]) == 0, capsys.readouterr().err
    student = str(tmp_path / "student")
    assert main(_distill(student, str(bert), data, "--max-steps", "2")) == 0
    assert load_run(student).config.distill.teacher == str(bert)
    teacher, texts = load_run(bert), ["的一是喜在不了有3", "和人这怒中大为上8"]
    probs = teacher_logits(teacher, texts, 1).softmax(-1)  # (2, C)
    for row, pred in zip(probs, teacher.predict(texts)):
        want = [pred["probs"][label] for label in teacher.labels.labels]
        torch.testing.assert_close(row, torch.tensor(want), rtol=0, atol=1e-6)


BERT_TINY = [
    "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--d-ff", "32",
    "--vocab-size", "90", "--min-frequency", "1", "--max-len", "16", "--batch-size", "16",
    "--max-steps", "2", "--tensorboard", "false", "--precision", "fp32", "--num-threads", "1",
    "--keep-state", "true",
]  # fmt: skip


def write_text(path: Path, n: int = 80) -> Path:
    """English-like lines whose pieces tie often (what made WordPiece training vary)."""
    stems = ["walk", "talk", "jump", "play", "read", "sing", "cook", "draw", "swim", "ride"]
    ends = ["", "s", "ed", "ing", "er"]
    lines = [
        " ".join(stems[(i * 7 + j) % 10] + ends[(i + j) % 5] for j in range(6)) for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# the pretraining objectives of `attnlab train mlm`, as command lines
OBJECTIVES = {"mlm": ["mlm"], "electra": ["mlm", "--objective", "electra"]}


@pytest.mark.parametrize("task", ["mlm", "electra"])
def test_one_seed_gives_one_tokenizer_and_one_set_of_weights(task, tmp_path, capsys) -> None:
    data = write_text(tmp_path / "text.txt")
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        argv = ["train", *OBJECTIVES[task], "--data", str(data), "--out", str(out), "--seed", "3"]
        assert main([*argv, *BERT_TINY]) == 0, capsys.readouterr().err
    for name in ("tokenizer.json", "model.safetensors"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name


@pytest.mark.parametrize("task", ["mlm", "electra"])
@pytest.mark.parametrize("prob", ["0", "1", "1.5"])
def test_a_mask_prob_outside_0_1_is_refused_before_the_folder(task, prob, tmp_path, capsys):
    out = tmp_path / "run"
    probe(capsys, ["train", *OBJECTIVES[task], "--out", str(out), "--mask-prob", prob],
          "mask_prob")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_an_lm_text_too_short_to_split_says_so_with_the_size_needed(tmp_path, capsys) -> None:
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("ab", encoding="utf-8")
    out = tmp_path / "lm"
    argv = ["train", "lm", "--data", str(tiny), "--out", str(out), "--context", "8"]
    needles = ("text too short for a validation split", "--context 8 needs 9")
    line = probe(capsys, argv, *needles, after_training=True)  # after the "data:" line
    assert "characters or more" in line and ".starting-" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.txt"]


def test_a_field_given_as_flag_and_as_field_value_is_refused(tmp_path, capsys) -> None:
    out = tmp_path / "run"  # TINY: were the check lost, a tiny run would fail this test fast
    argv = ["train", "classify", "--out", str(out), *TINY, "--max-steps", "2", "max_steps=4"]
    probe(capsys, argv, "max_steps is given twice", "--max-steps 2", "max_steps=4")
    probe(capsys, ["train", "classify", "--out", str(out), "lr=1", "lr=2"], "lr is given twice")
    assert list(tmp_path.iterdir()) == []


def test_generate_refuses_a_kv_cache_kind_without_a_cache(tmp_path, capsys) -> None:
    argv = ["generate", str(tmp_path), "--kv-cache", "int8", "--no-cache"]
    probe(capsys, argv, "--kv-cache int8", "--no-cache")


# were a check lost, these would train a tiny language model and fail fast, not the default one
LM_TINY = ["--config", "quick", "--max-steps", "1", "--d-model", "16", "--n-layers", "1",
           "--tensorboard", "false", "--num-threads", "1"]  # fmt: skip


def lm_text(path: Path) -> Path:
    path.write_text("anna sees bob.\n" * 200, encoding="utf-8")
    return path


@pytest.mark.parametrize("mixer", ["mamba", "rwkv"])
def test_attention_settings_with_an_attention_free_mixer_are_refused(mixer, tmp_path, capsys):
    out, data = tmp_path / "lm", lm_text(tmp_path / "text.txt")
    lm = ["train", "lm", "--mixer", mixer, "--data", str(data), *LM_TINY, "--out", str(out)]
    probe(capsys, [*lm, "--backend", "flash"], "--backend", "would be ignored", f"--mixer {mixer}")
    probe(capsys, [*lm, "window=8"], "--window")
    assert not out.exists()


def test_bench_refuses_negative_threads_and_writes_inside_an_out_folder(tmp_path, capsys):
    from attnlab.bench.command import report_path

    probe(capsys, ["bench", "--num-threads", "-2", "--out", str(tmp_path / "r")], "-2")
    assert list(tmp_path.iterdir()) == []
    assert report_path(tmp_path) == tmp_path / "bench-report.md"  # an existing folder
    assert report_path(tmp_path / "mine") == tmp_path / "mine.md"


def test_an_lm_context_of_one_token_is_refused_before_the_folder(tmp_path, capsys) -> None:
    data = lm_text(tmp_path / "text.txt")
    argv = ["train", "lm", "--data", str(data), *LM_TINY, "--out", str(tmp_path / "lm")]
    probe(capsys, [*argv, "--context", "1"], "--context 1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"]


def test_fp16_off_cuda_is_refused_before_the_run_folder(tmp_path, capsys):
    """fp16 trains only through CUDA's GradScaler: on the CPU the command is one line, exit 2,
    before any data is prepared or model built, and no folder is left."""
    data, out = write_corpus(tmp_path / "tiny.csv", n=32), tmp_path / "run"
    probe(capsys, ["train", "classify", "--out", str(out), "--data", str(data), *TINY,
                   "--precision", "fp16"], "--precision fp16 needs a CUDA GPU")  # fmt: skip
    assert not out.exists()
