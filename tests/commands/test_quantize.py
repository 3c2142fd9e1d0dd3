"""`attnlab quantize RUN --out OUT`: every verb reads OUT (predict, eval, attention, explore,
generate, translate), its quality stays near RUN's, and bad input exits 2 writing nothing."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "explore"))
import explore_runs  # noqa: E402  (tiny run folders of every kind)

from attnlab.cli import main  # noqa: E402
from attnlab.compress.int8 import Int8Linear  # noqa: E402
from attnlab.runs import training  # noqa: E402
from attnlab.runs.load import load_run  # noqa: E402

CLASSIFY = {"arch": "char", "extra_train": "",
            "d_model": "32", "n_heads": "2", "n_layers": "1", "d_ff": "64", "epochs": "6",
            "batch_size": "16", "lr": "3e-3", "tensorboard": "false", "precision": "fp32",
            "min_freq": "1", "checkpoint_every": "10", "dropout": "0.0"}  # fmt: skip


def classify_corpus(path: Path) -> Path:
    rng = random.Random(0)
    filler = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动"
    lines = ["text,label"]
    for i in range(240):
        marker, label = [("喜", "happy"), ("怒", "angry"), ("平", "calm")][i % 3]
        body = [rng.choice(filler) for _ in range(rng.randint(5, 30))]
        body.insert(rng.randrange(len(body) + 1), marker)
        lines.append(f"{''.join(body)},{label}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def classify_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("quantize")
    torch.set_num_threads(1)
    data = classify_corpus(root / "train.csv")
    training.train("classify", root / "run", {"data": str(data), **CLASSIFY})
    return root / "run"


def test_quantized_classifier_serves_every_verb(classify_run, tmp_path, capsys) -> None:
    out = tmp_path / "int8"
    assert main(["quantize", str(classify_run), "--out", str(out)]) == 0
    assert "linear layers int8" in capsys.readouterr().out
    assert (out / "quantization.json").is_file() and not (out / "state").exists()
    model = load_run(out).model
    assert any(isinstance(m, Int8Linear) for m in model.modules())
    float_size = (classify_run / "model.safetensors").stat().st_size
    assert (out / "model.safetensors").stat().st_size < float_size
    assert main(["eval", str(classify_run), "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert main(["eval", str(out), "--json"]) == 0
    after = json.loads(capsys.readouterr().out)
    assert abs(after["accuracy"] - before["accuracy"]) <= 0.05
    assert main(["predict", str(out), "这个很喜欢"]) == 0
    assert capsys.readouterr().out.strip()
    assert main(["attention", str(out), "这个很喜欢", "--out", str(tmp_path / "a.png")]) == 0
    assert (tmp_path / "a.png").is_file()
    assert main(["explore", str(out), "这个很喜欢", "--out", str(tmp_path / "e.html")]) == 0
    assert (tmp_path / "e.html").is_file()
    dyn = tmp_path / "int8_dynamic"
    assert main(["quantize", str(classify_run), "--out", str(dyn), "--activations", "dynamic"]) == 0
    capsys.readouterr()
    assert main(["eval", str(dyn), "--json"]) == 0
    assert abs(json.loads(capsys.readouterr().out)["accuracy"] - before["accuracy"]) <= 0.05


def test_bad_input_exits_2_and_writes_nothing(classify_run, tmp_path, capsys) -> None:
    out = tmp_path / "q"
    assert main(["quantize", str(classify_run), "--out", str(out)]) == 0
    capsys.readouterr()
    again = tmp_path / "qq"
    assert main(["quantize", str(out), "--out", str(again)]) == 2
    err = capsys.readouterr().err
    assert "already an int8-quantised run" in err and len(err.strip().splitlines()) == 1
    assert not again.exists()
    listing = sorted(p.name for p in out.rglob("*"))
    assert main(["train", "classify", "--out", str(out), "--resume"]) == 2
    assert "already an int8-quantised run" in capsys.readouterr().err
    assert sorted(p.name for p in out.rglob("*")) == listing  # nothing written
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert main(["quantize", str(classify_run), "--out", str(tmp_path / "full")]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # argparse's own choices: exit 2
        main(["quantize", str(classify_run), "--out", str(tmp_path / "z"), "--activations", "4"])
    assert exit_.value.code == 2
    assert not (tmp_path / "z").exists()


def test_quantized_lm_and_translation_runs(tmp_path, capsys) -> None:
    lines = [f"{random.Random(i).choice(['anna', 'bob'])} sees cleo." for i in range(400)]
    (tmp_path / "c.txt").write_text("\n".join(lines) + "\n")
    lm_run = tmp_path / "lm"
    training.train("lm", lm_run, {"data": str(tmp_path / "c.txt"), "max_steps": "30",
                                "eval_every": "30", "sample_tokens": "0", "eval_windows": "4"},
                 "quick")  # fmt: skip
    assert main(["quantize", str(lm_run), "--out", str(tmp_path / "lm8")]) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "lm8"), "--prompt", "anna", "--max-new-tokens",
                 "10", "--temperature", "0"]) == 0  # fmt: skip
    assert capsys.readouterr().out.startswith("anna")
    assert main(["explore", str(tmp_path / "lm8"), "anna", "--out", str(tmp_path / "l.html")]) == 0
    tr = tmp_path / "tr"
    assert main(["train", "translate", "--config", "copy", "--out", str(tr),
                 "--max-steps", "60"]) == 0  # fmt: skip
    assert main(["quantize", str(tr), "--out", str(tmp_path / "tr8")]) == 0
    capsys.readouterr()
    assert main(["translate", str(tmp_path / "tr8"), "abcabc"]) == 0
    assert capsys.readouterr().out.strip() != ""
    assert main(["eval", str(tmp_path / "tr8"), "--json"]) == 0
    assert "chrf" in json.loads(capsys.readouterr().out)


RUN_KINDS = {
    "lm": lambda root: explore_runs.gpt_run(root),
    "classify": lambda root: explore_runs.classifier_run(root),
    "translate": lambda root: explore_runs.translate_run(root),
    "vit": lambda root: explore_runs.vision_run(root, "vit"),
    "cnn": lambda root: explore_runs.vision_run(root, "cnn", channel_attention="se"),
    "bert_classify": lambda root: explore_runs.bert_classifier_run(root),
}


@pytest.mark.parametrize("kind", list(RUN_KINDS))
def test_every_run_kind_quantizes_and_loads(kind, tmp_path) -> None:
    """Tiny run folders of every kind (tests/explore/explore_runs.py, random weights)."""
    from attnlab.commands.quantize import quantize_run

    info = quantize_run(RUN_KINDS[kind](tmp_path / "run"), tmp_path / "q")
    model = load_run(tmp_path / "q").model
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) == info["layers"] > 0
