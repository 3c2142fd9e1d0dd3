"""T5 as the translation task's architecture (`attnlab train translate --arch t5`): cached
decoding equals the uncached full forward, and a T5 run trains, translates, evaluates and opens
in the explorer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.infer.beam import DecodeSettings, beam_search, greedy_decode
from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.models.t5 import T5Translator, t5_from_seq2seq, translator
from attnlab.tasks.translate import build_config


def tiny_t5(seed: int, activation: str = "relu") -> T5Translator:
    torch.manual_seed(seed)
    cfg = Seq2SeqConfig(
        src_vocab_size=23, tgt_vocab_size=23, d_model=16, n_heads=2, n_encoder_layers=2,
        n_decoder_layers=2, d_ff=24, dropout=0.0, activation=activation,
    )  # fmt: skip
    t5 = t5_from_seq2seq(cfg)
    t5.num_buckets, t5.max_distance = 8, 12  # a few steps already reach the log buckets
    return T5Translator(t5).double().eval()


def random_src(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 23, (3, 9), generator=g)  # (B, S)
    src[1, 6:] = 0  # right padding
    src[2, 4:] = 0
    return src


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("activation", ["relu", "geglu_tanh"])
def test_cached_steps_equal_the_full_forward(seed: int, activation: str) -> None:
    """Feeding the target one token at a time through the KV caches gives, at every step, the
    logits of the uncached teacher-forced pass (relative bias over the cached keys included)."""
    model = tiny_t5(seed, activation)
    src = random_src(seed)
    g = torch.Generator().manual_seed(seed + 10)
    body = torch.randint(3, 23, (3, 14), generator=g)
    tgt = torch.cat([torch.ones(3, 1, dtype=torch.long), body], dim=1)  # <s> y1 .. (B, 15)
    with torch.no_grad():
        full = model(src, tgt)  # (B, T, V)
        memory, src_mask = model.encode(src)
        caches, cross = model.new_caches()
        steps = [
            model.decode(
                tgt[:, t : t + 1], memory, src_mask, offset=t, caches=caches, cross_caches=cross
            )  # fmt: skip
            for t in range(tgt.shape[1])
        ]
    diff = (torch.cat(steps, dim=1) - full).abs().max().item()
    assert diff < 1e-10, f"seed {seed}: cached vs full differ by {diff}"


@pytest.mark.parametrize("seed", [0, 3])
def test_greedy_and_beam_with_cache_equal_without(seed: int) -> None:
    model = tiny_t5(seed)
    src = random_src(seed)
    cached = DecodeSettings(1, 2, 0.0, 12, use_cache=True)
    uncached = DecodeSettings(1, 2, 0.0, 12, use_cache=False)
    assert greedy_decode(model, src, cached) == greedy_decode(model, src, uncached), seed
    assert beam_search(model, src, cached, 3) == beam_search(model, src, uncached, 3), seed


def test_arch_defaults_to_the_transformer_and_t5_needs_one_vocabulary() -> None:
    cfg = build_config("copy", {"src_vocab_size": 9, "tgt_vocab_size": 9})
    assert cfg.arch == "seq2seq"
    assert type(translator(cfg.arch, cfg.model)).__name__ == "Seq2SeqTransformer"
    cfg = build_config("copy", {"arch": "t5", "src_vocab_size": 9, "tgt_vocab_size": 9})
    assert type(translator(cfg.arch, cfg.model)).__name__ == "T5Translator"
    with pytest.raises(ValueError, match="unknown --arch 'transformer' for translate; one of"):
        build_config("copy", {"arch": "transformer"})
    with pytest.raises(ValueError, match="shared_embeddings"):
        build_config("copy", {"arch": "t5", "shared_embeddings": "false"})
    with pytest.raises(ValueError, match="geglu_tanh"):
        build_config("copy", {"arch": "t5", "activation": "gelu"})


def test_t5_run_trains_translates_evaluates_and_explores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "t5"
    args = ["train", "translate", "--config", "copy", "--arch", "t5", "--synthetic-size", "300"]
    args += ["--max-steps", "6", "--eval-every", "6", "--checkpoint-every", "6", "--out", str(run)]
    assert main(args) == 0
    results = json.loads((run / "results.json").read_text())
    assert json.loads((run / "config.json").read_text())["model"]["arch"] == "t5"
    capsys.readouterr()
    assert main(["translate", str(run), "abc"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert main(["eval", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == results["test"]["n"]
    from attnlab.explore.seq2seq import translate_examples
    from attnlab.explore.sources import load_source

    source = load_source(run)
    assert source.kind == "translate" and isinstance(source.run.model, T5Translator)
    page = translate_examples(source, ["abcd"], beam_size=1)
    names = [g["name"] for g in page["examples"][0]["groups"]]
    assert names[0].startswith("cross-attention"), names
    assert main(["explore", str(run), "abcd", "--out", str(tmp_path / "p.html")]) == 0
    assert (tmp_path / "p.html").stat().st_size > 1000
