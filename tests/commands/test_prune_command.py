"""`attnlab prune RUN --heads N --out OUT`: OUT is a run every classifier verb accepts, with
smaller attention layers; bad requests are one-line errors that write nothing."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.runs import load_run, training

TINY = {
    "arch": "char", "extra_train": "",
    "d_model": "32", "n_heads": "4", "n_layers": "2", "d_ff": "64", "epochs": "6",
    "batch_size": "16", "lr": "3e-3", "tensorboard": "false", "precision": "fp32",
    "min_freq": "1", "checkpoint_every": "10", "dropout": "0.0", "attn_dropout": "0.0",
    "emb_dropout": "0.0", "ngram_buckets": "0",
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


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("prune")
    run = root / "run"
    training.train("classify", run, {"data": str(write_corpus(root / "d.csv")), **TINY})
    return run


def test_the_pruned_run_works_with_every_verb(trained, tmp_path, capsys):
    out = tmp_path / "pruned"
    assert main(["prune", str(trained), "--heads", "3", "--out", str(out)]) == 0
    assert "removed 3 heads" in capsys.readouterr().out
    report = json.loads((out / "prune.json").read_text())
    assert sum(report["heads_per_layer"]) == 5 and min(report["heads_per_layer"]) >= 1
    assert report["parameters_after"]["attention"] < report["parameters_before"]["attention"]
    run = load_run(out)
    heads = [block.self_attn.n_heads for block in run.model.encoder.blocks]
    assert heads == report["heads_per_layer"]
    assert list(run.config.model.heads_per_layer) == heads
    for verb in ("predict", "eval", "attention"):
        args = {"predict": ["喜喜"], "eval": [], "attention": ["喜喜", "--out"]}[verb]
        if verb == "attention":
            args.append(str(tmp_path / "a.png"))
        assert main([verb, str(out), *args]) == 0, verb
    page = tmp_path / "page.html"
    assert main(["explore", str(out), "喜喜平", "--out", str(page)]) == 0
    assert page.stat().st_size > 1000
    acc = report["val_after"]["accuracy"]
    assert 0.0 <= acc <= 1.0


def test_bad_requests_are_one_line_errors(trained, tmp_path, capsys):
    out = tmp_path / "x"
    assert main(["prune", str(trained), "--heads", "7", "--out", str(out)]) == 2
    assert "--heads 7" in capsys.readouterr().err and not out.exists()
    out.mkdir()
    assert main(["prune", str(trained), "--heads", "1", "--out", str(out)]) == 2
