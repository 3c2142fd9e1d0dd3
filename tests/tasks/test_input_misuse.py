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
    run, csv = mlm_run
    before = snapshot(run)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(run / "checkpoint", ckpt)
    (ckpt / "config.json").write_text(json.dumps(config))
    probe(capsys, ["embed", str(ckpt), "a movie"], str(ckpt), needle)
    out = tmp_path / "out"
    argv = ["train", "classify", "--init", str(ckpt), "--data", str(csv), "--out", str(out)]
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
    probe(capsys, ["embed", str(bad), "a movie"], needle)
    out = tmp_path / "out"
    argv = ["train", "classify", "--init", str(bad), "--data", str(csv), "--out", str(out)]
    probe(capsys, [*argv, "--max-steps", "1", "--tensorboard", "false"], needle)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bad"]
    assert snapshot(run) == before
