"""`attnlab generate` with speculative decoding (--draft, --prompt-lookup, --lookahead) and the
int8 KV cache (--kv-cache), end to end on a tiny trained run; bad input exits 2."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.runs import training

QUICK = {"lr": "1e-2", "max_steps": "60", "eval_every": "60", "eval_windows": "8",
         "sample_tokens": "0", "checkpoint_every": "60"}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("lm_infer")
    rng = random.Random(0)
    names, verbs = ["anna", "bob", "cleo"], ["sees", "likes", "hears"]
    (root / "corpus").mkdir()
    lines = [f"{rng.choice(names)} {rng.choice(verbs)} {rng.choice(names)}." for _ in range(800)]
    (root / "corpus" / "a.txt").write_text("\n".join(lines) + "\n")
    torch.set_num_threads(1)
    data = {"data": str(root / "corpus"), **QUICK}
    training.train("lm", root / "target", data, "quick")
    training.train("lm", root / "draft", {**data, "n_layers": "1"}, "quick")
    return root / "target", root / "draft"


def generate(*args: str) -> list[str]:
    return ["generate", *args, "--prompt", "anna", "--max-new-tokens", "40"]


def test_speculative_greedy_prints_the_plain_greedy_text(runs, capsys) -> None:
    target, draft = runs
    assert main([*generate(str(target)), "--temperature", "0"]) == 0
    plain = capsys.readouterr().out
    for extra in (["--draft", str(draft)], ["--prompt-lookup"]):
        for k in ("1", "5"):
            assert main([*generate(str(target)), "--temperature", "0", *extra,
                         "--lookahead", k]) == 0  # fmt: skip
            out = capsys.readouterr()
            assert out.out == plain, (extra, k)
            assert "speculative:" in out.err and "accepted" in out.err
    assert main([*generate(str(target)), "--draft", str(draft), "--stop", "."]) == 0
    assert "." not in capsys.readouterr().out


def test_speculative_bad_input_exits_2_and_prints_nothing(runs, tmp_path, capsys) -> None:
    target, draft = runs
    for k in ("0", "-1"):
        assert main([*generate(str(target)), "--draft", str(draft), "--lookahead", k]) == 2
        out = capsys.readouterr()
        assert "--lookahead must be >= 1" in out.err and out.out == ""
    assert main([*generate(str(target)), "--draft", str(draft), "--prompt-lookup"]) == 2
    assert "choose one" in capsys.readouterr().err
    other = tmp_path / "other"  # the same vocabulary size, another alphabet order
    shutil.copytree(draft, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    tok["chars"] = tok["chars"].replace("a", "z")
    (other / "tokenizer.json").write_text(json.dumps(tok))
    assert main([*generate(str(target)), "--draft", str(other)]) == 2
    out = capsys.readouterr()
    assert "another tokenizer" in out.err and out.out == ""
    from attnlab.interop.hf_gpt2 import save_hf_gpt2
    from attnlab.models.gpt import GPT, GPTConfig

    save_hf_gpt2(GPT(GPTConfig(vocab_size=50257, context=16, n_layers=1, n_heads=2,
                               d_model=16)), tmp_path / "gpt2")  # fmt: skip
    assert main([*generate(str(target)), "--draft", str(tmp_path / "gpt2")]) == 2
    out = capsys.readouterr()
    assert "vocabulary" in out.err and out.out == ""
    assert main([*generate(str(target)), "--num-samples", "2", "--prompt-lookup"]) == 2
    assert "one sample" in capsys.readouterr().err


def test_kv_cache_option(runs, capsys) -> None:
    target, draft = runs
    assert main([*generate(str(target)), "--temperature", "0", "--kv-cache", "int8"]) == 0
    assert capsys.readouterr().out.startswith("anna")
    assert main([*generate(str(target)), "--temperature", "0", "--kv-cache", "int8",
                 "--draft", str(draft)]) == 0  # fmt: skip
    assert capsys.readouterr().out.startswith("anna")
    assert main([*generate(str(target)), "--kv-cache", "fp8"]) == 2
    out = capsys.readouterr()
    assert "--kv-cache must be one of float, int8" in out.err and out.out == ""
