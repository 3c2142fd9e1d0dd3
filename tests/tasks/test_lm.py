"""End-to-end tests of the language-model task on a small synthetic corpus (fast, CPU)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.infer.lm import LMRun, generate_text
from attnlab.interop.hf_gpt2 import save_hf_gpt2
from attnlab.runs import training
from attnlab.tasks import lm
from attnlab.tasks.lm import build_config
from attnlab.train import load_weights


def write_corpus(folder: Path, seed: int = 0) -> Path:
    """Two files of short, very regular lines: a model learns them within a few dozen steps."""
    rng = random.Random(seed)
    names, verbs = ["anna", "bob", "cleo"], ["sees", "likes", "hears"]
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(2):
        lines = [
            f"{rng.choice(names)} {rng.choice(verbs)} {rng.choice(names)}." for _ in range(600)
        ]
        (folder / f"part{f}.txt").write_text("\n".join(lines) + "\n")
    return folder


QUICK = {
    "lr": "1e-2",
    "max_steps": "100",
    "eval_every": "50",
    "eval_windows": "8",
    "sample_tokens": "20",
    "checkpoint_every": "10",
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("lm")
    corpus = write_corpus(root / "corpus")
    torch.set_num_threads(1)
    results = training.train("lm", root / "run", {"data": str(corpus), **QUICK}, "quick")
    return root / "run", results


def test_training_learns_the_corpus_and_writes_the_run(trained) -> None:
    run, results = trained
    for name in ("config.json", "tokenizer.json", "model.safetensors", "metrics.jsonl"):
        assert (run / name).exists(), name
    for name in ("curves.png", "sample.txt", "results.json", "data/train.bin", "data/val.bin"):
        assert (run / name).exists(), name
    report = json.loads((run / "data_report.json").read_text())
    vocab = report["vocab_size"]
    assert vocab == len(set("anna bob cleo sees likes hears.\n"))
    assert results["val_loss"] < 0.3 * math.log(vocab)  # far below a uniform guess
    vals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in vals if r["split"] == "val"] == [50, 100]
    assert len(results["sample"]) > 0


def test_the_reported_val_loss_is_the_whole_split_and_says_so(trained) -> None:
    """The monitoring sample (eval_windows = 8) picks the best step; the figure the
    run reports is the best weights on every validation window, and results.json says which."""
    run, results = trained
    from attnlab.data.text_lm import eval_starts, open_tokens
    from attnlab.runs import load_run

    loaded = load_run(run)
    val = open_tokens(run / "data" / "val.bin", loaded.tokenizer.vocab_size)
    every = eval_starts(len(val), loaded.model.cfg.context, 0)
    assert len(every) > 8
    want = lm.mean_loss(loaded.model, val, every, 32)
    assert results["val_loss"] == pytest.approx(want, rel=1e-6)
    summary = json.loads((run / "summary.json").read_text())
    assert results["monitor_val_loss"] == summary["best_metric"] != results["val_loss"]
    assert results["val_scope"].startswith(f"whole validation split, {len(every)} windows")
    assert results["monitor_scope"].startswith("8 evenly spaced windows")
    line = lm.TASK.describe(results, run)[0]
    assert "whole validation split" in line and "monitoring sample" in line


def test_resume_after_an_interrupt_ends_with_identical_weights(trained, tmp_path, monkeypatch):
    run, _ = trained
    config = json.loads((run / "config.json").read_text())
    overrides = {"data": config["data"]["data"], **QUICK}
    calls = {"n": 0}
    real_step = lm.lm_step

    def interrupted(model, batch):
        calls["n"] += 1
        if calls["n"] == 75:  # past the epoch end at step 67 and the checkpoint at 70
            raise KeyboardInterrupt
        return real_step(model, batch)

    monkeypatch.setattr(lm, "lm_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        training.train("lm", tmp_path / "run", overrides, "quick")
    monkeypatch.setattr(lm, "lm_step", real_step)
    training.train("lm", tmp_path / "run", overrides, "quick", resume=True)
    for name in ("model.safetensors", "state/model.safetensors"):
        a, b = LMRun.load(run).model, LMRun.load(tmp_path / "run").model
        load_weights(a, run / name)
        load_weights(b, tmp_path / "run" / name)
        for (key, x), y in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(x, y), (name, key)


def test_generate_command_streams_samples_stops_and_crops(trained, capsys) -> None:
    run, _ = trained
    args = ["generate", str(run), "--prompt", "anna", "--max-new-tokens", "40", "--seed", "3"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert first.startswith("anna") and len(first) == len("anna") + 40 + 1
    assert main([*args, "--no-cache"]) == 0
    assert capsys.readouterr().out == first  # same seed, same logits: the same text
    assert main([*args, "--stop", "."]) == 0
    stopped = capsys.readouterr().out
    assert "." not in stopped and first.startswith(stopped.rstrip("\n"))
    assert main([*args, "--num-samples", "3", "--temperature", "1.5"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- sample") == 3
    assert main(["generate", str(run), "--prompt", "anna " * 20, "--max-new-tokens", "3"]) == 0
    assert "only its last 32 tokens are used" in capsys.readouterr().err


def test_generate_reports_bad_input_clearly(trained, tmp_path, capsys) -> None:
    run, _ = trained
    assert main(["generate", str(run), "--prompt", "Zebra!", "--max-new-tokens", "5"]) == 2
    assert (
        "2 character(s) are not in the model's vocabulary of 15: '!', 'Z'"
        in capsys.readouterr().err
    )
    assert main(["generate", str(run), "--prompt", "anna", "--top-p", "0"]) == 2
    out = capsys.readouterr()
    assert "--top-p must be in" in out.err and out.out == ""  # nothing printed before the error
    assert main(["generate", str(tmp_path), "--max-new-tokens", "5"]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_stop_strings_end_each_sample_independently(trained) -> None:
    model, tok = LMRun.load(trained[0]).model, LMRun.load(trained[0]).tokenizer
    out = generate_text(
        model, tok, "bob", 60, temperature=1.0, num_samples=4, stops=["s", "."], seed=1
    )
    for text in out.texts:
        assert "s" not in text and "." not in text
    full = generate_text(model, tok, "bob", 60, temperature=1.0, num_samples=4, seed=1)
    assert out.new_tokens < full.new_tokens == 240


def test_generate_runs_a_hugging_face_gpt2_directory(trained, tmp_path, capsys) -> None:
    save_hf_gpt2(LMRun.load(trained[0]).model, tmp_path / "chars")
    assert main(["generate", str(tmp_path / "chars"), "--max-new-tokens", "5"]) == 2
    assert "has no tokenizer.json" in capsys.readouterr().err  # 15 characters are not GPT-2's
    gpt2 = lm.GPT(lm.GPTConfig(vocab_size=50257, context=16, n_layers=1, n_heads=2, d_model=16))
    save_hf_gpt2(gpt2, tmp_path / "gpt2")
    args = ["generate", str(tmp_path / "gpt2"), "--prompt", "Hello", "--max-new-tokens", "4"]
    assert main([*args, "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("Hello")
    assert LMRun.load(tmp_path / "gpt2").source == "hf-gpt2"


def test_cli_trains_with_presets_and_field_options(tmp_path, capsys) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    args = ["train", "lm", "--config", "quick", "--data", str(corpus), "--max-steps", "6"]
    assert main([*args, "--eval-every", "3", "--out", str(tmp_path / "r"), "n_layers=1"]) == 0
    out = capsys.readouterr()
    assert "best val_loss" in out.out and "model: " in out.err
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert saved["model"]["n_layers"] == 1 and saved["train"]["max_steps"] == 6


def test_presets_build_and_bad_settings_say_what_to_change() -> None:
    for name in ("baby", "small", "gpt2", "llama", "quick"):
        cfg = build_config(name, {})
        cfg.model.vocab_size = 100
        cfg.model.validate(complete=True)
    assert build_config("llama", {}).model.pos == "rope"
    with pytest.raises(ValueError, match="did you mean n_layers"):
        build_config(None, {"n_layer": "3"})
    with pytest.raises(
        ValueError, match="'tokenizer': 'word' is not one of the choices 'char', 'gpt2', 'bpe'"
    ):
        build_config(None, {"tokenizer": "word"})
    with pytest.raises(ValueError, match="bundled: .*lm_baby"):
        build_config("nonesuch", {})
