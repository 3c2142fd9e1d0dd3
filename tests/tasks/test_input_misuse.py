"""Bad input at the command line's edges: checkpoint configs, text that is not Unicode, the
explore server's headers, decompression bombs, a device torch lacks, broken run files.

Each probe expects one line on stderr and exit 2 (no traceback), no folder left behind, and an
earlier run unchanged (see `_cli.probe`).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from _cli import probe, snapshot

from attnlab.cli import main

TINY_MLM = [
    "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--d-ff", "32",
    "--vocab-size", "60", "--min-frequency", "1", "--max-len", "16", "--batch-size", "16",
    "--tensorboard", "false", "--precision", "fp32", "--num-threads", "1",
]  # fmt: skip
WORDS = ["the", "a", "movie", "film", "plot", "actor", "story", "was", "very", "and", "but"]


def english(root: Path, n: int = 80) -> tuple[Path, Path]:
    """A plain-text corpus and a labelled CSV of random English words."""
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(n)]
    (root / "c.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = [f"{line},{'pos' if i % 2 else 'neg'}" for i, line in enumerate(lines)]
    (root / "c.csv").write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return root / "c.txt", root / "c.csv"


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory) -> tuple[Path, Path]:
    """A two-step `attnlab train mlm` run (never modified) and a labelled CSV."""
    root = tmp_path_factory.mktemp("mlm")
    txt, csv = english(root)
    run = root / "mlm"
    assert main(["train", "mlm", "--data", str(txt), "--out", str(run), "--max-steps", "2",
                 *TINY_MLM]) == 0  # fmt: skip
    return run, csv


# ---------------------------------------------------------------------------- BERT checkpoints

BAD_CONFIGS = [
    ([1, 2], "JSON list"),
    (None, "null"),
    ({"model_type": "gpt2", "vocab_size": 5}, "'gpt2' model"),
    ({"model_type": "roberta"}, "'roberta' model"),
    ({"model_type": ["bert"]}, "['bert'] model"),
    ({"vocab_size": 60, "hidden_size": "abc", "num_hidden_layers": 1}, "hidden_size"),
    ({"vocab_size": 60, "hidden_size": 16, "num_hidden_layers": 1, "hidden_act": "swish"},
     "'swish'"),
    ({"vocab_size": 60, "hidden_size": 16, "num_hidden_layers": 1, "hidden_act": ["gelu"]},
     "hidden_act"),
    ({"vocab_size": 60, "hidden_size": 16, "num_hidden_layers": 1, "layer_norm_eps": "x"},
     "layer_norm_eps"),
]  # fmt: skip


@pytest.mark.parametrize(("config", "needle"), BAD_CONFIGS)
def test_a_config_json_that_is_not_a_bert_config_is_one_line(
    config, needle, mlm_run, tmp_path, capsys
) -> None:
    def rewrite(ckpt: Path) -> None:
        (ckpt / "config.json").write_text(json.dumps(config))

    damaged_checkpoint_is_refused(mlm_run, tmp_path, capsys, rewrite, needle)


def damaged_checkpoint_is_refused(mlm_run, tmp_path, capsys, damage, needle) -> None:
    """A copy of the mlm run's checkpoint, damaged by ``damage(folder)``, is refused in one
    line naming ``needle`` by ``embed`` and by ``train classify --init``, with no folder left
    and the run unchanged."""
    run, csv = mlm_run
    before = snapshot(run)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(run / "checkpoint", ckpt)
    damage(ckpt)
    probe(capsys, ["embed", "--arch", str(ckpt), "a movie"], str(ckpt), needle)
    out = tmp_path / "out"
    argv = ["train", "classify", "--arch", str(ckpt), "--data", str(csv), "--out", str(out)]
    probe(capsys, [*argv, "--max-steps", "1", "--tensorboard", "false"], needle)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert snapshot(run) == before


def _half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def _resize(path: Path) -> None:
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "hidden_size": 32, "intermediate_size": 64}))


@pytest.mark.parametrize(
    ("name", "damage", "needle"),
    [
        ("config.json", _half, "not a valid JSON file"),
        ("config.json", _resize, "does not fit"),
        ("model.safetensors", _half, "model.safetensors"),
        ("tokenizer.json", _half, "tokenizer.json"),
        ("tokenizer.json", lambda p: p.write_text("[]"), "tokenizer.json"),
    ],
)
def test_a_damaged_mlm_checkpoint_is_one_line(
    name, damage, needle, mlm_run, tmp_path, capsys
) -> None:
    run, csv = mlm_run
    before = snapshot(run)
    bad = tmp_path / "bad"
    shutil.copytree(run, bad)
    damage(bad / "checkpoint" / name)
    probe(capsys, ["embed", "--arch", str(bad), "a movie"], needle)
    out = tmp_path / "out"
    argv = ["train", "classify", "--arch", str(bad), "--data", str(csv), "--out", str(out)]
    probe(capsys, [*argv, "--max-steps", "1", "--tensorboard", "false"], needle)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bad"]
    assert snapshot(run) == before


# ---------------------------------------------------------------------------- text not Unicode


def _with_lone_surrogate(csv: Path, out: Path) -> Path:
    """The CSV's rows as JSON lines, one of them holding the escape of a lone surrogate."""
    lines = csv.read_text(encoding="utf-8").splitlines()[1:]
    rows = [json.dumps({"text": t, "label": y}) for t, y in (r.rsplit(",", 1) for r in lines)]
    rows[3] = '{"text": "\\ud800 the film", "label": "neg"}'
    out.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return out


@pytest.mark.parametrize("task", ["classify", "mlm", "electra"])
def test_a_lone_surrogate_in_a_data_file_is_read_as_a_replacement_character(
    task, mlm_run, tmp_path
) -> None:
    from attnlab.data.tabular import load_labeled_file

    data = _with_lone_surrogate(mlm_run[1], tmp_path / "s.jsonl")
    texts = load_labeled_file(data).texts
    assert "\ufffd the film" in texts and not any("\ud800" in t for t in texts)
    tiny = TINY_MLM if task != "classify" else [
        "--arch", "char", "--extra-train", "", "--d-model", "16", "--n-heads", "2",
        "--n-layers", "1", "--d-ff", "32", "--min-freq", "1", "--batch-size", "16",
        "--tensorboard", "false",
    ]  # fmt: skip
    if task == "electra":
        tiny = [*tiny, "--objective", "electra", "--generator-fraction", "0.5"]
    out = tmp_path / task
    command = "classify" if task == "classify" else "mlm"
    assert main(["train", command, "--data", str(data), "--out", str(out), "--max-steps", "1",
                 *tiny]) == 0  # fmt: skip


# ---------------------------------------------------------------------------- --device


def test_a_device_torch_lacks_is_refused_before_any_folder(mlm_run, tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU-only build
    _, csv = mlm_run
    out = tmp_path / "run"
    base = ["train", "classify", "--data", str(csv), "--out", str(out), "--max-steps", "1"]
    probe(capsys, [*base, "--device", "cuda"], "--device cuda", "no CUDA device", "--device cpu")
    probe(capsys, [*base, "--device", "gpu"], "'gpu'", "cpu or cuda")
    probe(capsys, ["train", "classify", "--arch", "minilm", "--data", str(csv), "--out",
                   str(out), "--device", "cuda"], "no CUDA device")  # fmt: skip
    probe(capsys, ["generate", str(tmp_path), "--device", "cuda"], "no CUDA device")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------- run files


NO_SPECIALS = '{"model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}}'


@pytest.fixture(scope="module")
def translate_run(tmp_path_factory) -> Path:
    """A two-step run of the synthetic copy task (never modified)."""
    run = tmp_path_factory.mktemp("translate") / "copy"
    tiny = ["--max-steps", "2", "--eval-every", "2", "--synthetic-size", "200", "--d-model", "16",
            "--n-heads", "2", "--n-encoder-layers", "1", "--n-decoder-layers", "1",
            "--d-ff", "32"]  # fmt: skip
    assert main(["train", "translate", "--config", "copy", "--out", str(run), *tiny]) == 0
    return run


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:100]), "not a readable tokenizer file"),
        (lambda p: p.write_text("[]"), "not a readable tokenizer file"),
        (lambda p: p.write_text(NO_SPECIALS), "special tokens"),
    ],
)
def test_a_damaged_translation_tokenizer_is_one_line(
    damage, needle, translate_run, tmp_path, capsys
) -> None:
    before = snapshot(translate_run)
    bad = tmp_path / "bad"
    shutil.copytree(translate_run, bad)
    damage(bad / "tokenizer.json")
    probe(capsys, ["translate", str(bad), "abc"], "tokenizer.json", needle)
    probe(capsys, ["eval", str(bad)], "tokenizer.json", needle)
    assert snapshot(translate_run) == before


@pytest.mark.parametrize("flag", ["--vocab-size", "--tgt-tokenizer-size"])
def test_a_vocabulary_without_room_past_the_special_tokens_is_refused(flag, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "translate", "--config", "copy", "--out", str(out), flag, "3"]
    if flag == "--tgt-tokenizer-size":
        argv += ["--shared-embeddings", "false"]
    probe(capsys, argv, flag[2:].replace("-", "_"), "special tokens", "5 or more")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("task", [["classify"], {"name": "classify"}, 7, None])
def test_a_run_config_whose_task_is_not_a_name_is_one_line(task, translate_run, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(translate_run, bad)
    raw = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**raw, "task": task}))
    before = snapshot(bad)
    probe(capsys, ["translate", str(bad), "abc"], "config.json", "'task' must name a task")
    probe(capsys, ["train", "translate", "--out", str(bad), "--resume"], "'task' must name")
    assert snapshot(bad) == before


def test_verify_json_into_a_folder_is_refused_before_the_checks_run(tmp_path, capsys) -> None:
    probe(capsys, ["verify", "--only", "scaled_dot", "--json", str(tmp_path)], "is a folder")
    where = tmp_path / "no" / "t.json"
    probe(capsys, ["verify", "--only", "scaled_dot", "--json", str(where)], "no folder")
    (tmp_path / "notes.txt").write_text("mine\n")
    where = tmp_path / "notes.txt" / "t.json"
    probe(capsys, ["verify", "--only", "scaled_dot", "--json", str(where)], "notes.txt is a file")
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
